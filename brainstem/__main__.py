"""``brainstem`` and ``python -m brainstem``.

Kept tiny on purpose: the command line is imported only when needed, so the
sleep path of ``brainstem wake`` stays cheap.
"""

import sys


def main() -> None:
    from .cli import main as cli_main

    sys.exit(cli_main())


if __name__ == "__main__":
    main()
