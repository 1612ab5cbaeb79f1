"""``brainstem`` and ``python -m brainstem``.

Kept tiny on purpose: ``brainstem wake`` (in any of the forms cron and systemd
use: ``--quiet``, ``--verbose``, ``--log-format text|json``) first asks the
light sleep path whether the agent is asleep, and only then pays for the
command line, pydantic and the rest.
"""

import sys

_FLAGS = {"-q": "quiet", "--quiet": "quiet", "-v": "verbose", "--verbose": "verbose"}


def wake_form(argv: list[str]) -> dict | None:
    """The options of a ``wake`` the sleep path can answer alone, or None (``--force``, ``--help``,
    anything it does not know: the full command line handles those, and reports mistakes)."""
    if not argv or argv[0] != "wake":
        return None
    form = {"quiet": False, "verbose": False, "log_format": "text"}
    rest = iter(argv[1:])
    for arg in rest:
        if arg in _FLAGS:
            form[_FLAGS[arg]] = True
        elif arg == "--log-format":
            form["log_format"] = next(rest, None)
        elif arg.startswith("--log-format="):
            form["log_format"] = arg.split("=", 1)[1]
        else:
            return None
    return form if form["log_format"] in ("text", "json") else None


def main() -> None:
    form = wake_form(sys.argv[1:])
    if form is not None:
        from brainstem.state.sleep import asleep_fast, asleep_line

        until = asleep_fast()
        if until is not None:
            line = asleep_line(until, **form, tty=sys.stdout.isatty())
            if line:
                print(line)
            sys.exit(0)
    from brainstem.operator.cli import main as cli_main

    sys.exit(cli_main())


if __name__ == "__main__":
    main()
