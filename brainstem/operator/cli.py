"""The command line: argument handling and printing, nothing else.

Every failure the runtime expects is one line on stderr and a non-zero exit;
a traceback appears only with ``--debug``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from brainstem import __version__
from brainstem.core import keys
from brainstem.core.errors import BadArgument, BrainstemError, LockHeld, MalformedValue, NotFound, NotText
from brainstem.store import karma as karma_mod


class Ctx:
    """What every command shares: settings and the store, opened on first use."""

    def __init__(self, debug: bool):
        self.debug = debug
        self._settings = None
        self._store = None

    @property
    def settings(self):
        if self._settings is None:
            from brainstem.core.settings import load_settings

            self._settings = load_settings()
        return self._settings

    @property
    def store(self):
        if self._store is None:
            from brainstem.store import open_store

            self._store = open_store(self.settings.kv, prefix=self.settings.agent)
        return self._store


pass_ctx = click.make_pass_decorator(Ctx)


def _json_lines(items) -> None:
    """One JSON object per line: what every list command prints with --json."""
    for item in items:
        click.echo(json.dumps(item, ensure_ascii=False))


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
      brainstem wake --force                 # run a session now (needs OPENROUTER_API_KEY)
      brainstem status                       # where it stands; then `brainstem karma`

    
    Before a change goes live:
      brainstem wake --dry-run               # a whole session that changes nothing
      brainstem replay 12                    # session 12 again, against today's prompts and config
    """
    ctx.obj = Ctx(debug)


# --- seed -----------------------------------------------------------------

@cli.command()
@click.option("--soul", "soul_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Set the soul from this file when the store has none (an existing soul is never replaced).")
@click.option("--example-soul", is_flag=True, help="Use the shipped example soul when the store has none.")
@click.option("--force", is_flag=True, help="Rewrite seeded keys even if present (the soul is still never replaced).")
@click.option("--with-providers", is_flag=True,
              help="Also write the editable tier-1 LLM adapter and balance checkers (provider:*). They need "
                   "OPENROUTER_API_KEY in BRAINSTEM_TOOL_SECRETS (bound to the LLM endpoint's host) to work; "
                   "without it the hard-coded client answers.")
@pass_ctx
def seed(c: Ctx, soul_file: Path | None, example_soul: bool, force: bool, with_providers: bool) -> None:
    """Write the shipped prompts, config and tools into the store.

    Idempotent: keys already present are kept (the agent may have improved
    them), unless --force. The soul is set only when absent.

    \b
    Examples:
      brainstem seed --example-soul
      brainstem seed --soul my_soul.md
      brainstem seed --force            # put the shipped prompts, config and tools back
    """
    from brainstem.state.seed import example_soul_path, read_soul_file
    from brainstem.state.seed import seed as do_seed

    if soul_file and example_soul:
        raise click.UsageError("give --soul FILE or --example-soul, not both")
    soul = example_soul_path() if example_soul else soul_file
    if soul is not None:
        read_soul_file(soul)  # a wrong path fails here, before the store is even opened
    report = do_seed(c.store, soul_file=soul, force=force, with_providers=with_providers)
    counts = [f"{len(report.written)} written"]
    if report.unchanged:
        counts.append(f"{len(report.unchanged)} unchanged (already the shipped value)")
    if report.kept or not force:
        counts.append(f"{len(report.kept)} already present (kept; --force rewrites them)")
    click.echo(f"seeded {c.store.display_url}: {', '.join(counts)}")
    if report.soul == "set":
        click.echo("soul: set")
    elif report.soul == "kept":
        click.echo("soul: present (kept; the soul is never overwritten)")
    else:
        click.echo("soul: not set yet; run `brainstem seed --soul FILE` (or --example-soul) before the first wake")


# --- wake -----------------------------------------------------------------

@cli.command()
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the demo's store in this directory (default: a temporary one, deleted at the end).")
def demo(keep: Path | None) -> None:
    """Run a whole session offline, with no API key, against recorded LLM answers.

    Seeds a fresh agent on a throwaway embedded store, runs one session
    (orient, an action, a think, a conditional, reflect) through the real
    runtime, chokepoint, sandbox and karma, with the model's answers played
    back from a cassette shipped in the package, then prints the flight
    recorder and where to go next. The throwaway store is deleted when the
    demo ends; --keep DIR keeps it there to look around in.

    \b
    Examples:
      brainstem demo
      brainstem demo --keep ./demo
      BRAINSTEM_KV=sqlite:///demo/demo.db brainstem sessions   # three slashes: relative
    """
    from brainstem.operator.demo import run_demo

    code = run_demo(click.echo, keep=keep)
    if code:
        raise BrainstemError("the demo session did not end clean; see its karma above")


@cli.command()
@click.option("--force", is_flag=True, help="Run a session even if the agent is meant to be asleep.")
@click.option("--verbose", "-v", is_flag=True, help="Also say so when the agent is asleep.")
@click.option("--llm-cassette", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Answer every LLM call from this recorded cassette instead of a provider (replay, tests).")
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
    the lock (or took it over mid-session: this one's lease ran out, so it
    stopped and left its end to that wake), 143 / 130 stopped by SIGTERM /
    SIGINT (the session is recorded as interrupted and the lock released).

    \b
    Examples:
      brainstem wake                 # from cron: */5 * * * * brainstem wake
      brainstem wake --force         # run now, whatever the schedule says
      brainstem wake --dry-run       # what would it do now? (no tool runs, nothing written)
      brainstem karma                # then read what it did
    """
    from brainstem.session.wake import wake as do_wake

    providers = None
    if llm_cassette is not None:
        from brainstem.llm.cassette import CassetteProvider

        providers = [CassetteProvider(llm_cassette)]
    listeners = []
    if not quiet:
        from brainstem.operator.progress import listener

        listeners.append(listener(log_format, click.echo, tty=sys.stdout.isatty() and log_format == "text"))
    from brainstem.core.outcomes import operator_action
    from brainstem.session.interrupt import SignalGuard, WakeInterrupted

    with SignalGuard() as guard:
        try:
            result = do_wake(c.settings, c.store, force=force, providers=providers, listeners=listeners,
                             cancel=guard.cancel, dry_run=dry_run)
        except WakeInterrupted as exc:  # before a session began: nothing to record
            click.echo(f"wake stopped by {exc} before a session began", err=True)
            sys.exit(128 + exc.signum)
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
                               "operator_action": operator_action(result.outcome),
                               "message": result.message}))
    else:
        click.echo(result.message)
    if guard.signum is not None:
        sys.exit(128 + guard.signum)
    if result.status == "lease_lost":
        sys.exit(LockHeld.exit_code)


# --- run ------------------------------------------------------------------

@cli.command()
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
@pass_ctx
def run(c: Ctx, every, cron, agents, jitter, misfire_grace, grace, log_format, metrics_port, metrics_host) -> None:
    """Stay running and wake the agent on a schedule (instead of cron).

    Each fire runs `wake`: it sleeps if it is not time yet, else runs a
    session. Fires never overlap for one agent, and the wake lease keeps
    hosts apart: run the same agents on several hosts against one Redis, and
    an agent whose host dies is taken over within about two lease periods
    (BRAINSTEM_LEASE_SECONDS). Every fire is recorded in the agent's
    wake_log. SIGTERM or Ctrl-C stops it cleanly; exit 0.

    \b
    Examples:
      brainstem run --every 5m
      brainstem run --cron "*/10 * * * *" --jitter 30
      brainstem run --every 1m --agent scout --agent scribe
      brainstem run --every 5m --metrics-port 9464   # Prometheus scrapes :9464/metrics
    """
    import logging
    import os

    from brainstem.session.scheduler import Runner

    _setup_logging(log_format)
    metrics = None
    if metrics_port is not None:
        from brainstem.operator.metrics import Metrics, serve

        metrics = Metrics()
        try:
            serve(metrics, metrics_port, metrics_host)
        except OSError as exc:
            raise BrainstemError(f"--metrics-port {metrics_port}: cannot listen on {metrics_host}: "
                                 f"{exc.strerror or exc}") from None
    runner = Runner(c.settings, list(agents) or [None], grace=grace, metrics=metrics)
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


# --- status and sessions --------------------------------------------------

LABEL = 17  # status labels are padded to this many characters, so the values line up


def _row(label: str, value: str) -> None:
    click.echo(f"{label:<{LABEL}} {value}")


def _text(value, none: str = "-") -> str:
    """A value for a text line: never ``None`` or a Python repr (structures are JSON)."""
    if value is None:
        return none
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _usd(value, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"${value:,.{digits}f}"


def _table(rows: list[list[str]], right: tuple[int, ...] = (), header: list[str] | None = None) -> list[str]:
    """Rows as lines in aligned columns (the last column is not padded); ``right``: right-aligned columns."""
    every = ([header] if header else []) + rows
    if not every:
        return []
    widths = [max(len(r[i]) for r in every) for i in range(len(every[0]))]
    lines = []
    for r in every:
        cells = [(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])) if i < len(r) - 1 else cell
                 for i, cell in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return lines


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_ctx
def status(c: Ctx, as_json: bool) -> None:
    """Where the agent stands: last session, spend today, balances, next wake, crashes in a row.

    Also: a session running now (or one that died), what the operator must do
    after a fault, cost anomalies, secret bindings and the sandbox's protections.

    \b
    Examples:
      brainstem status
      brainstem status --json | jq .cost_today
      brainstem sessions --since 1d          # then what ran today
    """
    from brainstem.operator.status import status as get_status

    report = get_status(c.store, c.settings)
    if as_json:
        click.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    last = report["last_session"] or {}
    truth = report["balances_last_seen"] or {}
    bal = truth.get("balances") if isinstance(truth.get("balances"), dict) else {}

    def money(v):
        return "unknown" if v is None else _usd(v, 2)
    _row("store", report["store"])
    soul = report["soul_present"]
    _row("soul", "present" if soul is True else "MISSING (brainstem seed --soul FILE)" if not soul
         else "NOT TEXT (brainstem kv put soul --file FILE --force-soul)")
    _row("sessions", _text(report["sessions"]))
    if last:
        _row("last session", f"{_text(last.get('id'))}  {_text(last.get('outcome'))}  "
                             f"{_text(last.get('ended_at') or last.get('started_at'))}  {_usd(last.get('cost') or 0)}  "
                             f"{_text(last.get('steps', 0))} steps")
    if last and report.get("operator_action"):
        _row("OPERATOR", report["operator_action"])
    run_ = report["running"]
    if run_:
        where = f" (pid {run_.get('pid')} on {_text(run_.get('host'), 'unknown host')})" if run_.get("pid") else ""
        if run_["state"] == "running":
            _row("running now", f"session {_text(run_.get('id'))} since {_text(run_.get('started_at'))}{where}")
        elif run_["state"] == "locked":
            _row("running now", f"a wake holds the lock ({_text(run_.get('lock_holder'))}), no session begun yet")
        else:
            _row("died", f"session {_text(run_.get('id'), '(unknown id)')} started "
                         f"{_text(run_.get('started_at'), 'at an unknown time')}{where} and is gone (its lock "
                         f"expired or its process exited); the next wake records it as crashed")
    if report.get("session_history_rejected"):
        r = report["session_history_rejected"]
        _row("history problem", f"{_text(r.get('at'))}: {_text(r.get('reason'))} (its raw text is kept in "
                                f"{_text(r.get('raw_kept_at'))})")
    for d in report.get("history_damaged") or []:
        _row("HISTORY DAMAGED", f"entry {_text(d.get('position'))} of session_history is not readable JSON "
                                f"(session {_text(d.get('id'), 'unknown')}); it is listed as damaged, and its karma "
                                f"stays readable with brainstem karma")
    _row("failing in a row", _text(report["failing_in_a_row"]))
    _row("spent today", f"{_usd(report['cost_today'])} of {_usd(report['daily_ceiling'], 2)} (per session at most "
                        f"{_usd(report['session_ceiling'], 2)})")
    _row("balances", f"LLM credit {money(bal.get('openrouter'))}, wallet USDC {money(bal.get('wallet_usdc'))}"
         + (f" (as of {_text(truth.get('at'))})" if truth else ""))
    _row("next wake", f"{report['next_wake_after'] or 'due now'}{' (asleep)' if report['asleep'] else ''}")
    _row("deep reflection", f"{'due at next wake' if report['deep_reflection_due_next_wake'] else 'not due'} "
                            f"({_text(report['deep_reflection'])})")
    for p in report["config_problems"] or []:
        _row("config problem", _text(p))
    for n, a in enumerate(report["cost_anomalies_today"] or [], 1):
        head = (f"{_text(a.get('at'))} session {_text(a.get('session_id'))}: the endpoint reported "
                f"{_usd(a.get('reported', 0))} for a {_text(a.get('model'))} call that could cost at most "
                f"{_usd(a.get('worst_case', 0))}.")
        if "corrected_to" in a:
            _row(f"COST ANOMALY {n}", f"{head} Corrected by the operator to {_usd(a['corrected_to'])}.")
        else:
            _row(f"COST ANOMALY {n}", f"{head} It counts towards today's ceiling as billed; check the provider's "
                                      f"activity page, and if it billed less, `brainstem anomaly {n} --billed USD` "
                                      f"corrects today's spend for this call alone.")
    refused = report.get("secret_refusals") or {}
    if refused.get("total"):
        hold = ("the agent's code is HELD until you clear it: brainstem refusals --clear" if refused.get("held")
                else "cleared")
        _row("SECRET REFUSED", f"{refused['total']} time(s), {refused['today']} today: code met secret text it "
                               f"could only have by a leak or a guess (last: {_text(refused.get('last_tool'))} at "
                               f"{_text(refused.get('last_at'))}); {hold}. Look for secret_refused in its karma")
    if report["reviews_pending"]:
        _row("REVIEW", f"{report['reviews_pending']} run(s) of supervised tools wait for your verdict: "
                       f"brainstem review")
    reflexes = report.get("reflexes")
    if reflexes and reflexes.get("error"):
        _row("reflexes", f"IGNORED: {reflexes['error']}")
    elif reflexes:
        _row("reflexes", ", ".join(f"{r['name']} (last fired {_text(r['last_fired'], 'never')})"
                                   for r in reflexes["rules"]) or "none")
    for name, mode in (report.get("tool_mode_floors") or {}).items():
        _row("tool mode", f"{name}: at least {mode} (BRAINSTEM_TOOL_MODES)")
    sandbox = report.get("sandbox") or {}
    if sandbox.get("error"):
        _row("sandbox", sandbox["error"])
    else:
        prot = sandbox.get("protections") or {}
        on = [k for k, v in prot.items() if v.get("state") == "on"]
        off = [k for k, v in prot.items() if v.get("state") == "off"]
        _row("sandbox", f"runtime as {_text(sandbox.get('runtime'))}; on: {', '.join(on) or 'none'}"
             + (f"; OFF: {', '.join(off)} (brainstem status --json says why)" if off else ""))
    bindings = report["secret_bindings"]
    if not bindings:
        _row("secrets", "none bound (tools get no secrets; BRAINSTEM_TOOL_SECRETS binds NAME@HOST)")
    for label, b in bindings.items():
        _row("secret", f"{label} -> {', '.join(b['hosts'])}{'' if b['set'] else '  (NOT SET)'}")


def _json_type(value) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _outcome_counts(outcomes: dict) -> str:
    return ", ".join(f"{name} {n}" for name, n in outcomes.items()) or "-"


def _session_rows(rows: list[dict]) -> list[str]:
    cells = []
    for h in rows:
        dur = h.get("duration_ms")
        cells.append([_text(h.get("id")), _text(h.get("started_at")), _text(h.get("outcome")),
                      f"{_text(h.get('steps'))} steps", _usd(h.get("cost") or 0),
                      f"{dur / 1000:.1f}s" if isinstance(dur, (int, float)) else "-",
                      _text(h.get("summary"), "")[:60]])
    return _table(cells, right=(3, 4, 5))


@cli.command()
@click.option("--limit", "-n", type=click.IntRange(min=1), default=None,
              help="Show the last N sessions (or days, with --by-day).  [default: 20; all with --since]")
@click.option("--since", "since_text", metavar="WHEN",
              help="Only sessions started since WHEN: a duration back from now (30m, 12h, 7d, 2w) or a UTC date "
                   "or time (2026-05-01, 2026-05-01T12:00:00Z); prints totals after the rows.")
@click.option("--by-day", is_flag=True, help="One row per UTC day: sessions, cost and outcomes, then totals.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per session; with --since or --by-day, one JSON object with the rows "
                   "and the totals.")
@pass_ctx
def sessions(c: Ctx, limit: int | None, since_text: str | None, by_day: bool, as_json: bool) -> None:
    """Recent sessions, newest last: id, start, outcome, steps, cost, duration, summary.

    \b
    Examples:
      brainstem sessions                     # the last 20
      brainstem sessions --since 7d          # the last week, then totals by outcome
      brainstem sessions --since 2026-05-01 --json
      brainstem sessions --by-day --since 2w # per UTC day: sessions, cost, outcomes
      brainstem karma 12                     # one session's flight recorder, by its number
    """
    from brainstem.core.clock import iso
    from brainstem.state import history as session_history

    cutoff = session_history.parse_since(since_text) if since_text else None
    rows = session_history.started_since(session_history.read(c.store), cutoff)
    since = f" since {iso(cutoff)}" if cutoff else ""
    total = session_history.totals(rows)
    if by_day:
        days = session_history.by_day(rows)
        days = days[-limit:] if limit else days
        if as_json:
            click.echo(json.dumps({"since": iso(cutoff) if cutoff else None, "days": days, "totals": total},
                                  ensure_ascii=False))
            return
        if not days:
            click.echo(f"no sessions{since}")
            return
        cells = [[d["day"], str(d["sessions"]), _usd(d["cost"]), _outcome_counts(d["outcomes"])] for d in days]
        cells.append(["total", str(total["sessions"]), _usd(total["cost"]), _outcome_counts(total["outcomes"])])
        for line in _table(cells, right=(1, 2), header=["DAY", "SESSIONS", "COST", "OUTCOMES"]):
            click.echo(line)
        return
    if cutoff is None or limit is not None:
        rows = rows[-(limit or 20):]
    if as_json and cutoff is not None:
        click.echo(json.dumps({"since": iso(cutoff), "sessions": rows, "totals": total}, ensure_ascii=False))
        return
    if as_json:
        _json_lines(rows)
        return
    if not rows:
        click.echo(f"no sessions{since or ' yet'}")
        return
    for line in _session_rows(rows):
        click.echo(line)
    if cutoff is not None:
        shown = f" (showing the last {len(rows)})" if len(rows) < total["sessions"] else ""
        click.echo(f"{total['sessions']} session{'' if total['sessions'] == 1 else 's'}{since}, {_usd(total['cost'])}: "
                   f"{_outcome_counts(total['outcomes'])}{shown}")


@cli.command()
@click.argument("number", type=click.IntRange(min=1))
@click.option("--billed", type=click.FloatRange(min=0), required=True,
              help="What the provider actually billed for that call, in USD (0 when it was not billed).")
@pass_ctx
def anomaly(c: Ctx, number: int, billed: float) -> None:
    """Correct today's spend for one cost anomaly that `brainstem status` lists.

    A call whose reported cost is above the most it could cost is charged as
    reported (that is what the provider says it billed) and listed by status as
    COST ANOMALY N. When the provider's activity page shows it billed less, this
    takes the difference off today's spend, for that call alone.

    \b
    Examples:
      brainstem status                       # COST ANOMALY 1 ... reported $180.0000 ...
      brainstem anomaly 1 --billed 0.0021    # what the activity page shows
    """
    from brainstem.state.budget import correct_anomaly

    try:
        item, total = correct_anomaly(c.store, number, billed)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"cost anomaly {number} ({item.get('model')}, reported ${item.get('reported', 0):.4f}) corrected "
               f"to ${billed:.4f}; today's spend is now ${total:.4f}")


# --- tool -----------------------------------------------------------------

@cli.group()
def tool() -> None:
    """Run and inspect the agent's tools (Python stored in tool:NAME:code).

    \b
    Examples:
      brainstem tool ls
      brainstem tool run kv_read --input '{"key": "wisdom"}'
      brainstem history tool:web_fetch:code      # how the agent changed a tool
    """


@tool.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per tool.")
@pass_ctx
def tool_ls(c: Ctx, as_json: bool) -> None:
    """Every tool in the store: description, mode, KV access, secrets it asks for, timeout.

    A tool whose meta is invalid (or whose code is missing) is listed as
    INVALID with the reason: a session's step that calls it fails the same way.

    \b
    Examples:
      brainstem tool ls
      brainstem tool ls --json | jq -r 'select(.error) | .name'
    """
    from brainstem.tools.services import list_tools

    tools = list_tools(c.store)
    if as_json:
        _json_lines(tools)
        return
    if not tools:
        click.echo("no tools in the store (brainstem seed writes the shipped ones)")
        return
    rows = []
    for t in tools:
        if t["error"]:
            rows.append([t["name"], "INVALID", "", "", "", t["error"]])
            continue
        asked = list(t["secrets"]) + [f"secret:{n}" for n in t["kv_secrets"]]
        rows.append([t["name"], t["mode"], t["kv_access"], f"{t['timeout_ms'] / 1000:g}s", ",".join(asked) or "-",
                     " ".join((t["description"] or "").split())[:70]])
    for line in _table(rows, right=(3,), header=["NAME", "MODE", "KV", "TIMEOUT", "SECRETS", "DESCRIPTION"]):
        click.echo(line)


@tool.command("run")
@click.argument("name")
@click.option("--input", "input_json", default="{}", show_default=True, help="The tool's args, as JSON.")
@click.option("--verbose", "-v", is_flag=True, help="Print the karma events of the run to stderr.")
@pass_ctx
def tool_run(c: Ctx, name: str, input_json: str, verbose: bool) -> None:
    """Run one tool in the sandbox, exactly as a session would, and print its result as JSON.

    Secrets, KV access and fetch follow the tool's meta and your settings
    (BRAINSTEM_TOOL_SECRETS, BRAINSTEM_FETCH_ALLOW). Requests it sends to
    the LLM endpoint are metered under BRAINSTEM_MAX_SESSION_COST and count
    towards today's spend. This is not a session: nothing is added to session
    history and the schedule is untouched.

    \b
    Examples:
      brainstem tool run web_fetch --input '{"url": "https://example.org"}'
      brainstem tool run kv_read --input '{"key": "wisdom"}' -v
    """
    from brainstem.core.clock import now_iso
    from brainstem.core.timeline import format_entry
    from brainstem.state.guarded import AgentKV
    from brainstem.store.karma import Redactor
    from brainstem.tools.services import run_tool, standalone_tool_policy

    example = '--input \'{"url": "https://example.org"}\''
    try:
        args = json.loads(input_json)
    except ValueError as exc:
        raise BadArgument(f"--input is not valid JSON ({exc}); it must be a JSON object, e.g. {example}") from None
    if not isinstance(args, dict):
        raise BadArgument(f"--input must be a JSON object, e.g. {example}; got a JSON {_json_type(args)}")
    redact = Redactor(c.settings.known_secrets())

    def record(event: str, **fields) -> dict:
        entry = redact({"t": now_iso(ms=True), "event": event, **fields})
        if verbose:
            click.echo(format_entry(entry), err=True)
        return entry

    policy = standalone_tool_policy(c.store, c.settings, record,
                                    on_secrets=lambda secrets: [redact.add(k, v) for k, v in secrets.items()])
    out = run_tool(name, args, store=c.store, agent_kv=AgentKV(c.store, record), record=record, policy=policy)
    if not out.ok:
        raise BrainstemError(f"tool {name} failed: {redact(out.error or 'unknown error')}")
    click.echo(json.dumps(redact(out.value), indent=2, ensure_ascii=False))


# --- agents ---------------------------------------------------------------

@cli.group()
def agents() -> None:
    """The agents sharing one store, each confined to its own keys.

    \b
    An agent is named by BRAINSTEM_KV_PREFIX=NAME: (or run --agent NAME) and
    registers its name the first time it uses the store; after that no other
    agent, the default one included, can read, list or write its keys.

    \b
    Examples:
      brainstem agents list
      brainstem agents register bob            # before giving bob its own Redis ACL user
      brainstem agents register bob --adopt    # keys already under bob: are bob's own
    """


@agents.command("list")
@pass_ctx
def agents_list(c: Ctx) -> None:
    """Every registered agent name, one a line (the default agent has none)."""
    from brainstem.store import open_store

    with open_store(c.settings.kv, prefix="") as store:
        for name in sorted(store.registered_agents()):
            click.echo(name)


@agents.command("register")
@click.argument("name")
@click.option("--adopt", is_flag=True,
              help="Accept keys already under NAME: as NAME's own (an agent from before names were registered).")
@pass_ctx
def agents_register(c: Ctx, name: str, adopt: bool) -> None:
    """Register NAME, as opening the store as NAME does on first use."""
    from brainstem.core.names import agent_prefix
    from brainstem.store import open_store

    bare = agent_prefix(name, "agent name")[:-1]
    if not bare:
        raise BrainstemError("the default agent needs no registration; give a NAME")
    with open_store(c.settings.kv, prefix="") as store:
        store.register_agent(bare, adopt=adopt)
        click.echo(f"registered agent {bare} in {store.display_url}")


# --- kv -------------------------------------------------------------------

@cli.group()
def kv() -> None:
    """Read and write the store as the operator.

    \b
    The soul is protected here too: changing it needs --force-soul, the
    documented operator override, and is meant for deliberate rewrites.

    \b
    Examples:
      brainstem kv ls config:
      brainstem kv get config:defaults --json
      brainstem kv put wisdom "Be brief."
      brainstem kv put prompt:orient --file orient.md
    """


@kv.command("get")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Parse the value as JSON and pretty-print it.")
@pass_ctx
def kv_get(c: Ctx, key: str, as_json: bool) -> None:
    """Print the value of KEY (raw text by default)."""
    value = c.store.get(key)
    if value is None:
        if c.store.log_length(key):
            raise BrainstemError(f"{key!r} is a log, not a value; read it with `brainstem karma`")
        raise BrainstemError(f"no key {key!r} in {c.store.display_url}")
    if as_json:
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise MalformedValue(f"value of {key!r} is not valid JSON ({exc}); drop --json to see it raw") from None
        click.echo(json.dumps(parsed, indent=2, ensure_ascii=False))
    else:
        click.echo(value, nl=not value.endswith("\n"))


@kv.command("put")
@click.argument("key")
@click.argument("value", required=False)
@click.option("--file", "file_", type=click.File("r"), help="Read the value from a file ('-' for stdin).")
@click.option("--json", "as_json", is_flag=True, help="Require the value to be valid JSON (stored compact).")
@click.option("--force-soul", is_flag=True, help="Operator override: allow replacing the soul.")
@pass_ctx
def kv_put(c: Ctx, key: str, value: str | None, file_, as_json: bool, force_soul: bool) -> None:
    """Set KEY to VALUE (or the contents of --file)."""
    from brainstem.state.guarded import check_key, check_value

    if (value is None) == (file_ is None):
        raise click.UsageError("give exactly one of VALUE or --file")
    text = file_.read() if file_ is not None else value
    check_key(key)
    check_value(c.store, key, text, agent=False)  # config:reflexes: rules or nothing, whoever writes them
    if key == keys.SOUL and not force_soul:
        raise BrainstemError("soul is immutable; to replace it deliberately, add --force-soul")
    if as_json:
        try:
            text = json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
        except ValueError as exc:
            raise MalformedValue(f"value for {key!r} is not valid JSON: {exc}") from None
    from brainstem.state.versions import record_write

    old = _previous(c.store, key)
    c.store.put(key, text)
    version = record_write(c.store, key, old, text, source="operator")
    click.echo(f"put {key} ({len(text.encode())} bytes)" + (f", version {version}" if version else ""))


def _previous(store, key: str) -> str | None:
    """The value an operator write replaces, for its version history; a value that is not text
    (the reason for the write, often) is replaced without being recorded."""
    try:
        return store.get(key)
    except NotText:
        return None


@kv.command("ls")
@click.argument("prefix", default="")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many keys.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per key.")
@pass_ctx
def kv_ls(c: Ctx, prefix: str, limit: int, as_json: bool) -> None:
    """List keys starting with PREFIX (all keys by default)."""
    for k in c.store.list_all(prefix, limit=limit):
        if as_json:
            click.echo(json.dumps({"name": k.name, "metadata": k.metadata, "expiration": k.expiration,
                                   "log": k.is_log}))
        else:
            click.echo(f"{k.name}  (log)" if k.is_log else k.name)


@kv.command("del")
@click.argument("key")
@click.option("--force-soul", is_flag=True, help="Operator override: allow deleting the soul.")
@pass_ctx
def kv_del(c: Ctx, key: str, force_soul: bool) -> None:
    """Delete KEY (a value or a log)."""
    if key == keys.SOUL and not force_soul:
        raise BrainstemError("soul is immutable; to delete it deliberately, add --force-soul")
    from brainstem.state.versions import record_write

    old = _previous(c.store, key)
    if c.store.delete(key) or c.store.delete_log(key):
        record_write(c.store, key, old, None, source="operator")
        click.echo(f"deleted {key}")
    else:
        raise BrainstemError(f"no key {key!r} in {c.store.display_url}")


# --- versions -------------------------------------------------------------

@cli.command()
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per version, values included.")
@pass_ctx
def history(c: Ctx, key: str, as_json: bool) -> None:
    """List the recorded versions of a self-modified KEY (prompt:*, config:*, tool:*, provider:*, wisdom).

    A version is recorded at every change, by the agent or the operator; the
    value a key had before its first change is kept as version 1.

    \b
    Examples:
      brainstem history prompt:orient
      brainstem diff prompt:orient          # previous version -> current
      brainstem rollback prompt:orient      # restore the previous version
      brainstem changes --since 1d          # every change to any key
    """
    from brainstem.state.versions import no_versions_message, versions

    vs = versions(c.store, key)
    if not vs:
        if not keys.is_privileged(key):
            raise BadArgument(no_versions_message(key))
        if not as_json:
            click.echo(no_versions_message(key))
        return
    current = c.store.get(key)
    rows = []
    for v in vs:
        if as_json:
            click.echo(json.dumps(v, ensure_ascii=False))
            continue
        value = v.get("value")
        first = "(deleted)" if value is None else (value.strip().splitlines() or [""])[0][:60]
        rows.append(["*" if value == current else " ", f"v{v['version']}", v.get("at") or "before history",
                     _text(v.get("source"), ""), _text(v.get("session_id")),
                     f"{0 if value is None else len(value)}B", first])
    for line in _table(rows, right=(5,)):
        click.echo(line)


@cli.command()
@click.argument("key")
@click.argument("version", type=int, required=False)
@pass_ctx
def diff(c: Ctx, key: str, version: int | None) -> None:
    """Show what changed in KEY since VERSION (default: the previous version), as a unified diff.

    \b
    Examples:
      brainstem diff prompt:orient          # the last change
      brainstem diff config:defaults 1      # everything since the seeded original
      brainstem history config:defaults     # the version numbers
    """
    from brainstem.state.versions import diff as version_diff

    text = version_diff(c.store, key, version)
    click.echo(text if text else f"{key}: no difference")


@cli.command()
@click.argument("key")
@click.option("--to", "version", type=int, help="The version to restore (default: the previous one).")
@pass_ctx
def rollback(c: Ctx, key: str, version: int | None) -> None:
    """Restore KEY to an earlier version. The restore is recorded as a new version, so it can be undone too.

    \b
    Examples:
      brainstem rollback prompt:orient          # undo the last change
      brainstem rollback config:models --to 1   # back to the seeded original
      brainstem rollback prompt:orient          # again: undoes the rollback
    """
    from brainstem.state.versions import rollback as do_rollback

    if key == keys.SOUL:
        raise BrainstemError("soul is not versioned; set it deliberately with `kv put soul --force-soul`")
    out = do_rollback(c.store, key, version)
    click.echo(f"{key}: restored version {out['restored_version']} (now version {out['new_version']})")


@cli.command()
@click.option("--since", "since_text", metavar="WHEN",
              help="Only changes made since WHEN: a duration back from now (30m, 12h, 7d, 2w) or a UTC date or "
                   "time (2026-05-01).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per change.")
@pass_ctx
def changes(c: Ctx, since_text: str | None, as_json: bool) -> None:
    """Every recorded change to a versioned key, across keys, newest last.

    Each line: when, the key, its new version, who wrote it (the session's id,
    operator, or runtime) and the path it came through (reflect, deep_reflect,
    tool:NAME, operator, operator:rollback, seed --force, runtime:auto_restore).

    \b
    Examples:
      brainstem changes --since 7d
      brainstem changes --json | jq -r 'select(.who != "operator") | .key'
      brainstem diff prompt:orient           # then look at one of them
    """
    from brainstem.core.clock import iso
    from brainstem.state.history import parse_since
    from brainstem.state.versions import changes as all_changes

    cutoff = parse_since(since_text) if since_text else None
    found = all_changes(c.store, cutoff)
    if as_json:
        _json_lines(found)
        return
    if not found:
        click.echo("no changes recorded" + (f" since {iso(cutoff)}" if cutoff else " yet"))
        return
    rows = [[ch["at"], ch["key"], f"v{ch['version']}", ch["who"], _text(ch["source"], ""),
             "(deleted)" if ch["deleted"] else f"{ch['bytes']}B"] for ch in found]
    for line in _table(rows, right=(5,), header=["TIME", "KEY", "VERSION", "WHO", "PATH", "SIZE"]):
        click.echo(line)


# --- karma ----------------------------------------------------------------

@cli.command()
@click.argument("session_id", metavar="[SESSION]", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON entry per line, exactly as recorded.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing entries as they are recorded: exit 0 at the session's end, 1 when it died.")
@pass_ctx
def karma(c: Ctx, session_id: str | None, as_json: bool, follow: bool) -> None:
    """Show the flight recorder of a session (the most recently started by default).

    SESSION is a session id (12-a1b2c3) or its number (12).

    \b
    Examples:
      brainstem karma                  # the latest session, as a timeline
      brainstem karma 42               # session number 42
      brainstem karma 42-1a2b --json   # one session, machine-readable
      brainstem karma --follow         # watch the running session live
    """
    from brainstem.core.timeline import format_entry
    from brainstem.operator.status import session_gone
    from brainstem.state import history as session_history

    store = c.store
    if session_id is None:
        sid = karma_mod.latest_session_id(store)
        if sid is None:
            raise BrainstemError("no session has run yet; nothing to show (run `brainstem wake`)")
    else:
        sid = session_history.resolve_session(store, session_id.strip())
        if sid is None:
            raise NotFound(f"no session {session_id} in {store.display_url}; `brainstem sessions` lists them")
    if not follow and not store.log_length(keys.karma(sid)):
        entry = next((h for h in session_history.read(store) if h.get("id") == sid), None)
        why = (f" (it ended {_text(entry.get('outcome'))}; its karma was dropped after "
               f"BRAINSTEM_KARMA_RETENTION_DAYS, its summary is in `brainstem sessions`)") if entry else ""
        raise BrainstemError(f"no karma for session {sid}{why}")
    gone: list = []

    def stopped() -> bool:
        gone[:] = [session_gone(store, sid)]
        return gone[0] is not None
    entries = karma_mod.follow(store, sid, until=stopped) if follow else karma_mod.read(store, sid)
    if not as_json:
        click.echo(f"session {sid}")
    last = None
    for entry in entries:
        last = entry
        click.echo(json.dumps(entry, ensure_ascii=False) if as_json else format_entry(entry))
    if not follow or (last or {}).get("event") == "session_end":
        return
    state, why = gone[0] if gone and gone[0] else session_gone(store, sid) or ("died", "it stopped")
    if state == "ended":
        click.echo(f"session {sid} has ended ({why}) with no session_end in its karma", err=True)
        return
    raise BrainstemError(f"session {sid} died without recording its end: {why}; the next wake records it "
                         f"as crashed")


# --- wake_log -------------------------------------------------------------

@cli.command()
@click.option("--limit", "-n", type=click.IntRange(min=1), default=50, show_default=True,
              help="The last N fires.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per fire, exactly as recorded.")
@pass_ctx
def wakes(c: Ctx, limit: int, as_json: bool) -> None:
    """What the daemon (`brainstem run`) did at each fire, newest last: from the agent's wake_log.

    A fire ran a session (with its outcome), slept (the agent was not due),
    was skipped (another wake held the lock, or the previous fire was still
    running), lost its lease mid-session (another host took the agent over),
    was missed (later than --misfire-grace), or failed.

    \b
    Examples:
      brainstem wakes
      brainstem wakes -n 10 --json
      brainstem karma 12                 # a session a fire ran
    """
    from brainstem.session.scheduler import read_wake_log

    fires = read_wake_log(c.store, limit)
    if as_json:
        _json_lines(fires)
        return
    if not fires:
        click.echo("no fires recorded (the wake_log is written by `brainstem run`)")
        return
    rows = []
    for f in fires:
        fire = _text(f.get("fire"), "?")
        if fire == "ran":
            detail = f"session {_text(f.get('session_id'))}  {_text(f.get('outcome'))}"
        elif fire == "slept":
            detail = f"asleep until {_text(f.get('until'))}"
        elif fire == "skipped":
            detail = {"locked": "another wake held the lock",
                      "still_running": "the previous fire was still running"}.get(f.get("reason"),
                                                                                   _text(f.get("reason")))
            if f.get("scheduled"):
                detail += f" (scheduled {_text(f['scheduled'])})"
        elif fire == "lease_lost":
            detail = f"session {_text(f.get('session_id'))}  stopped: its wake lease was lost"
        elif fire == "missed":
            detail = f"scheduled {_text(f.get('scheduled'))}"
        elif fire == "error":
            detail = _text(f.get("error"))
        else:
            detail = " ".join(f"{k}={_text(v)}" for k, v in f.items() if k not in ("t", "fire"))
        rows.append([_text(f.get("t")), fire, detail])
    for line in _table(rows, header=["TIME", "FIRE", "DETAIL"]):
        click.echo(line)


from brainstem.operator.commands.dashboard import dashboard  # noqa: E402
from brainstem.operator.commands.refusals import refusals  # noqa: E402
from brainstem.operator.commands.replay import replay  # noqa: E402
from brainstem.operator.commands.review import review  # noqa: E402

cli.add_command(dashboard)
cli.add_command(refusals)
cli.add_command(replay)
cli.add_command(review)


# --- entry point ----------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Run the CLI; expected errors become one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        cli.main(args=args, prog_name="brainstem", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrainstemError as exc:
        if debug:
            raise
        click.echo(f"brainstem: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the operator gets one line, --debug gets the rest
        if debug:
            raise
        click.echo(f"brainstem: unexpected error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
                   err=True)
        return 1
    return 0
