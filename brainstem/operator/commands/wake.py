"""``brainstem wake`` and ``brainstem run``: one session now (cron's command), or a daemon that wakes on a schedule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from brainstem.core.errors import BadArgument, LeaseHeld
from brainstem.operator.commands.context import Ctx, pass_ctx


@click.command()
@click.option("--force", is_flag=True, help="Run a session even if the agent is meant to be asleep.")
@click.option("--verbose", "-v", is_flag=True, help="Also say so when the agent is asleep.")
@click.option("--llm-cassette", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Answer every LLM call from this recorded cassette instead of a provider: offline, no API key; "
                   "its calls are simulated (in the session's budget, never in today's spend).")
@click.option("--quiet", "-q", is_flag=True, help="Print only the one-line summary, not the live progress.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Progress as readable lines, or one JSON karma entry per line (journald, log shippers).")
@click.option("--dry-run", is_flag=True,
              help="Run one whole session now with the real LLM, changing nothing: tools do not run (each call "
                   "is a tool_would_do entry), writes are thrown away; only its karma (marked dry_run) and "
                   "today's spend are kept.")
@pass_ctx
def wake(c: Ctx, force: bool, verbose: bool, llm_cassette: Path | None, quiet: bool, log_format: str,
         dry_run: bool) -> None:
    """Run one wake cycle: what cron or a systemd timer calls.

    Sleeps (exit 0, silently) when it is not time yet. Otherwise: notices a
    crashed last session, reads balances, asks the LLM for a plan, runs it
    under the budgets, reflects, records everything in karma, printing each
    event as it happens (--quiet: only the closing summary line). Exit codes:
    0 slept or ran a session (even one with failed steps, or one the operator
    must look at: its line then says what to do), 2 misconfigured (no soul,
    no prompt:orient, bad setting), 3 store unreachable, 75 another wake holds
    the lease (or took it over mid-session: this one's lease ran out, so it
    stopped and left its end to that wake), 143 / 130 stopped by SIGTERM /
    SIGINT (the session is recorded as interrupted and the lease released).

    \b
    Examples:
      brainstem wake                 # from cron: */5 * * * * brainstem wake
      brainstem wake --force         # run now, whatever the schedule says
      brainstem wake --dry-run       # what would it do now? (no tool runs, nothing written)
      brainstem wake --force --llm-cassette demo/cassette.json   # offline, recorded answers
      brainstem karma                # then read what it did
    """
    from brainstem.session.wake import wake as do_wake

    providers = _providers(llm_cassette)
    listeners = _listeners(quiet, log_format)
    from brainstem.session.interrupt import SignalGuard, WakeInterrupted

    with SignalGuard() as guard:
        try:
            result = do_wake(c.settings, c.store, force=force, providers=providers, listeners=listeners,
                             cancel=guard.cancel, dry_run=dry_run)
        except WakeInterrupted as exc:  # before a session began: nothing to record
            click.echo(f"wake stopped by {exc} before a session began", err=True)
            sys.exit(128 + exc.signum)
    _print_result(result, quiet=quiet, verbose=verbose, log_format=log_format)
    if guard.signum is not None:
        sys.exit(128 + guard.signum)
    if result.status == "lease_lost":
        sys.exit(LeaseHeld.exit_code)


def _providers(llm_cassette: Path | None) -> list | None:
    """The recorded cassette as the only provider, or None for the configured ones."""
    if llm_cassette is None:
        return None
    from brainstem.llm.cassette import CassetteProvider

    return [CassetteProvider(llm_cassette)]


def _listeners(quiet: bool, log_format: str) -> list:
    """The live progress printer, unless --quiet."""
    if quiet:
        return []
    from brainstem.operator.progress import listener

    return [listener(log_format, click.echo, tty=sys.stdout.isatty() and log_format == "text")]


def _print_result(result, quiet: bool, verbose: bool, log_format: str) -> None:
    """The wake's closing line: asleep (only when asked), a JSON summary, or the session's message."""
    from brainstem.core.outcomes import operator_action

    if result.status == "asleep":
        from brainstem.core.clock import parse_iso
        from brainstem.state.sleep import asleep_line

        line = asleep_line(parse_iso(result.next_wake_after), quiet=quiet, verbose=verbose, log_format=log_format,
                           tty=sys.stdout.isatty())
        if line:
            click.echo(line)
    elif log_format == "json":  # every stdout line is JSON, the closing summary included
        click.echo(json.dumps({"event": "wake_result", "status": result.status, "outcome": result.outcome,
                               "session_id": result.session_id, "next_wake_after": result.next_wake_after,
                               "operator_action": operator_action(result.outcome), "reason": result.reason,
                               "message": result.message}))
    else:
        click.echo(result.message)


@click.command()
@click.option("--every", help="Wake on an interval: 30s, 5m, 1h, 1d.")
@click.option("--cron", help='Wake on a crontab expression in UTC, e.g. "*/10 * * * *".')
@click.option("--agent", "agents", multiple=True,
              help="Run this agent (its keys live under the prefix NAME:). Repeat for several. "
                   "Default: the store's agent (BRAINSTEM_KV_PREFIX).")
@click.option("--jitter", type=click.FloatRange(min=0), help="Spread each fire by up to this many seconds.")
@click.option("--misfire-grace", type=click.FloatRange(min=1), default=60, show_default=True,
              help="Seconds a late fire may still run; later than that it is recorded as missed.")
@click.option("--grace", type=click.FloatRange(min=0), default=30, show_default=True,
              help="On SIGTERM/SIGINT, seconds a running session gets to stop before it is recorded as interrupted.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="The daemon's log lines on stderr: readable text, or one JSON object per line "
                   "(journald, log shippers).")
@click.option("--metrics-port", type=click.IntRange(1, 65535),
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (wakes, sessions, LLM calls, tool runs, "
                   "spend today against the ceiling).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the metrics endpoint listens on (it shows counts and spend, never a secret).")
@click.option("--llm-cassette", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Answer every session's LLM calls from this recorded cassette, from its first answer at each "
                   "fire: offline, no API key; simulated spend, never today's. A session that asks more than it "
                   "holds gets a provider error, recorded in its karma like any other.")
@pass_ctx
def run(c: Ctx, every, cron, agents, jitter, misfire_grace, grace, log_format, metrics_port, metrics_host,
        llm_cassette) -> None:
    """Stay running and wake the agent on a schedule (instead of cron).

    Each fire runs `wake`: it sleeps if it is not time yet, else runs a
    session. Fires never overlap for one agent, and the wake lease keeps
    hosts apart: run the same agents on several hosts against one Redis, and
    an agent whose host dies is taken over within about two lease periods
    (BRAINSTEM_LEASE_SECONDS). Every fire is recorded in the agent's
    wake_log. SIGTERM or Ctrl-C stops it cleanly; exit 0.

    With BRAINSTEM_TELEGRAM_BOT_TOKEN and BRAINSTEM_TELEGRAM_CHAT_ID set, it
    also polls the Telegram bot: texts from that chat enter the (first)
    agent's inbox ("!text" is urgent), texts from other chats are counted
    and dropped. While it is not running, messages wait at Telegram (24 h).

    \b
    Examples:
      brainstem run --every 5m
      brainstem run --cron "*/10 * * * *" --jitter 30
      brainstem run --every 1m --agent scout --agent scribe
      brainstem run --every 5m --metrics-port 9464   # Prometheus scrapes :9464/metrics
      brainstem run --every 1m --llm-cassette demo/cassette.json   # offline, recorded answers
    """
    import logging
    import os

    from brainstem.daemon.scheduler import Runner

    _setup_logging(log_format)
    if llm_cassette is not None:
        _providers(llm_cassette)  # a cassette that cannot be read stops the daemon now (exit 2), not at each fire
    metrics = None
    if metrics_port is not None:
        from brainstem.operator.metrics import Metrics, serve

        metrics = Metrics()
        try:
            serve(metrics, metrics_port, metrics_host)
        except OSError as exc:
            raise BadArgument(f"--metrics-port {metrics_port}: cannot listen on {metrics_host}: "
                                 f"{exc.strerror or exc}") from None
    runner = Runner(c.settings, list(agents) or [None], grace=grace, metrics=metrics, cassette=llm_cassette)
    code = runner.run(every, cron, jitter=jitter, misfire_grace=misfire_grace)
    if any(a.running for a in runner.agents):
        logging.shutdown()
        os._exit(code)  # a session ignored the grace period; it is recorded as interrupted


def _setup_logging(fmt: str) -> None:
    import logging

    class JSONFormatter(logging.Formatter):
        def format(self, record):
            return json.dumps({"t": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                               "logger": record.name, "message": record.getMessage()})
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json"
                         else logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S"))
    for name, level in (("brainstem", logging.INFO), ("apscheduler", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]  # one format for every line, JSON included
        logger.setLevel(level)
        logger.propagate = False
