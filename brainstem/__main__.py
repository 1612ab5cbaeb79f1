"""``brainstem`` and ``python -m brainstem``.

Kept tiny on purpose: a plain ``brainstem wake`` first asks the light sleep
path whether the agent is asleep, and only then pays for the command line,
pydantic and the rest.
"""

import sys


def main() -> None:
    if sys.argv[1:] == ["wake"]:
        from .sleep import asleep_fast

        if asleep_fast() is not None:
            sys.exit(0)
    from .cli import main as cli_main

    sys.exit(cli_main())


if __name__ == "__main__":
    main()
