"""The command line: the ``brainstem`` group, its commands registered, and ``main``.

Each command lives in a module of :mod:`brainstem.operator.commands`; this
module only puts them together. Every failure the runtime expects is one line
on stderr and a non-zero exit; a traceback appears only with ``--debug``.
"""

from __future__ import annotations

import sys

import click

from brainstem import __version__
from brainstem.core.errors import BrainstemError
from brainstem.operator import output
from brainstem.operator.commands.agents import agents
from brainstem.operator.commands.context import Ctx
from brainstem.operator.commands.dashboard import dashboard
from brainstem.operator.commands.demo import demo
from brainstem.operator.commands.inbox import inbox_command, tell
from brainstem.operator.commands.karma import karma, sessions, wakes
from brainstem.operator.commands.kv import changes, diff, history, kv, rollback
from brainstem.operator.commands.mcp import mcp_command
from brainstem.operator.commands.refusals import refusals
from brainstem.operator.commands.replay import replay
from brainstem.operator.commands.review import review
from brainstem.operator.commands.schedule import schedule
from brainstem.operator.commands.seed import seed
from brainstem.operator.commands.status import anomaly, status
from brainstem.operator.commands.tool import tool
from brainstem.operator.commands.wake import run, wake


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="brainstem")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Brainstem: a timer-woken runtime for an autonomous LLM agent.

    Everything the agent is (soul, prompts, config, tools, memory) lives in a
    key-value store: the embedded SQLite file by default, Redis when
    BRAINSTEM_KV=redis://... is set.

    \b
    Start here:
      brainstem demo                         # a whole session, offline, no API key
      brainstem seed --example-soul          # give the agent prompts, config, tools and a soul
      brainstem wake --force                 # run a session now (needs BRAINSTEM_LLM_API_KEY)
      brainstem status                       # where it stands; then `brainstem karma`

    \b
    Before a change goes live:
      brainstem wake --dry-run               # a whole session that changes nothing
      brainstem replay 12                    # session 12 again, against today's prompts and config

    \b
    Doing the same thing regularly, without a session:
      brainstem schedule add check_or_balance --every 6h --notify inbox
      brainstem schedule list                # yours and the agent's, with their next runs

    \b
    Talking with it:
      brainstem tell "check the wallet"      # a message its next session reads (--urgent: due now)
      brainstem inbox                        # what you left, and whether it has read it
    """
    ctx.obj = Ctx(debug)


# The order commands were added in (``--help`` lists them by name either way).
for command in (seed, demo, wake, run, status, sessions, anomaly, tool, agents, kv, history, diff, rollback, changes,
                karma, wakes, dashboard, refusals, replay, review, tell, inbox_command, schedule, mcp_command):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; expected errors become one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = output.VisibleStream(sys.stdout), output.VisibleStream(sys.stderr)
    try:
        return _main(args)
    finally:
        sys.stdout, sys.stderr = streams


def _main(args: list[str]) -> int:
    debug = "--debug" in args
    try:
        # Not standalone, click hands back a command's `click.exceptions.Exit(n)` as n: that is the exit code.
        code = cli.main(args=args, prog_name="brainstem", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: its help is the answer
        exc.show()
        return exc.exit_code
    except click.UsageError as exc:
        if debug:
            exc.show()
        else:
            output.usage_error(exc.format_message(), exc.ctx.command_path if exc.ctx else "brainstem")
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrainstemError as exc:
        if debug:
            raise
        output.error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the operator gets one line, --debug gets the rest
        if debug:
            raise
        output.unexpected(exc)
        return 1
    return code if isinstance(code, int) and not isinstance(code, bool) else 0
