"""What ran: ``brainstem sessions`` (the session history), ``brainstem karma`` (one session's flight
recorder) and ``brainstem wakes`` (what the daemon did at each fire)."""

from __future__ import annotations

import click

from brainstem.core import keys
from brainstem.core.errors import BrainstemError, NotFound
from brainstem.operator.commands.context import Ctx, pass_ctx
from brainstem.operator.output import (
    as_text,
    clip,
    echo_lines,
    json_lines,
    json_text,
    print_json,
    spent,
    table,
)
from brainstem.store import karma as karma_mod


def _outcome_counts(outcomes: dict) -> str:
    return ", ".join(f"{name} {n}" for name, n in outcomes.items()) or "-"


def _sum(total: dict) -> str:
    return spent(total["cost"], total.get("simulated_cost"))


def _session_rows(rows: list[dict]) -> list[str]:
    cells = []
    for h in rows:
        dur = h.get("duration_ms")
        cells.append([as_text(h.get("id")), as_text(h.get("started_at")), as_text(h.get("outcome")),
                      f"{as_text(h.get('steps'))} steps",
                      spent(h.get("cost") or 0, h.get("simulated_cost")),
                      f"{dur / 1000:.1f}s" if isinstance(dur, (int, float)) else "-",
                      clip(_said(h))])
    return table(cells, right=(3, 4, 5),
                 header=["SESSION", "STARTED", "OUTCOME", "STEPS", "COST", "DURATION", "SUMMARY"])


def _said(h: dict) -> str:
    """What the SUMMARY column says of a session: its reflection's summary; a session that ended without one
    (it failed, crashed or was stopped) says why it ended, and where to read more."""
    for field in ("summary", "reason", "operator_action"):
        if h.get(field):
            return as_text(h[field])
    if h.get("outcome") == "clean":
        return ""
    number = h.get("number") or str(h.get("id") or "").split("-", 1)[0] or "N"
    if h.get("outcome") == "crashed":
        return f"its process died mid-session (brainstem karma {as_text(number)})"
    return f"ended {as_text(h.get('outcome'), 'with no outcome')}, no summary (brainstem karma {as_text(number)})"


@click.command()
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
    if by_day:
        _by_day(rows, cutoff, limit, as_json)
        return
    since = f" since {iso(cutoff)}" if cutoff else ""
    total = session_history.totals(rows)
    if cutoff is None or limit is not None:
        rows = rows[-(limit or 20):]
    if as_json and cutoff is not None:
        print_json({"since": iso(cutoff), "sessions": rows, "totals": total})
        return
    if as_json:
        json_lines(rows)
        return
    if not rows:
        click.echo(f"no sessions{since or ' yet'}")
        return
    echo_lines(_session_rows(rows))
    if cutoff is not None:
        shown = f" (showing the last {len(rows)})" if len(rows) < total["sessions"] else ""
        click.echo(f"{total['sessions']} session{'' if total['sessions'] == 1 else 's'}{since}, {_sum(total)}: "
                   f"{_outcome_counts(total['outcomes'])}{shown}")


def _by_day(rows: list[dict], cutoff, limit: int | None, as_json: bool) -> None:
    """``sessions --by-day``: one row per UTC day, then the totals."""
    from brainstem.core.clock import iso
    from brainstem.state import history as session_history

    total = session_history.totals(rows)
    days = session_history.by_day(rows)
    days = days[-limit:] if limit else days
    if as_json:
        print_json({"since": iso(cutoff) if cutoff else None, "days": days, "totals": total})
        return
    if not days:
        click.echo(f"no sessions{f' since {iso(cutoff)}' if cutoff else ''}")
        return
    cells = [[d["day"], str(d["sessions"]), _sum(d), _outcome_counts(d["outcomes"])] for d in days]
    cells.append(["total", str(total["sessions"]), _sum(total), _outcome_counts(total["outcomes"])])
    echo_lines(table(cells, right=(1, 2), header=["DAY", "SESSIONS", "COST", "OUTCOMES"]))


@click.command()
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

    store = c.store
    sid = _session_to_show(store, session_id, follow)
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
        click.echo(json_text(entry) if as_json else format_entry(entry))
    if not follow or (last or {}).get("event") == "session_end":
        return
    state, why = gone[0] if gone and gone[0] else session_gone(store, sid) or ("died", "it stopped")
    if state == "ended":
        click.echo(f"session {sid} has ended ({why}) with no session_end in its karma", err=True)
        return
    raise BrainstemError(f"session {sid} died without recording its end: {why}; the next wake records it "
                         f"as crashed")


def _session_to_show(store, session_id: str | None, follow: bool) -> str:
    """The id of the session ``karma`` shows: the one named, else the latest; an error when it has no karma
    to show (unless following it: its karma may be about to begin)."""
    from brainstem.state import history as session_history

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
        why = (f" (it ended {as_text(entry.get('outcome'))}; its karma was dropped after "
               f"BRAINSTEM_KARMA_RETENTION_DAYS, its summary is in `brainstem sessions`)") if entry else ""
        raise BrainstemError(f"no karma for session {sid}{why}")
    return sid


@click.command()
@click.option("--limit", "-n", type=click.IntRange(min=1), default=50, show_default=True,
              help="The last N fires.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per fire, as recorded (one that older daemons wrote as slept reads asleep).")
@pass_ctx
def wakes(c: Ctx, limit: int, as_json: bool) -> None:
    """What the daemon (`brainstem run`) did at each fire, newest last: from the agent's wake_log.

    A fire ran a session (with its outcome), found the agent asleep (not due),
    was skipped (another wake held the lease, or the previous fire was still
    running), lost its lease mid-session (another host took the agent over),
    was missed (later than --misfire-grace), or failed.

    \b
    Examples:
      brainstem wakes
      brainstem wakes -n 10 --json
      brainstem karma 12                 # a session a fire ran
    """
    from brainstem.daemon.scheduler import read_wake_log

    fires = read_wake_log(c.store, limit)
    if as_json:
        json_lines(fires)
        return
    if not fires:
        click.echo("no fires recorded (the wake_log is written by `brainstem run`)")
        return
    rows = [[as_text(f.get("t")), as_text(f.get("fire"), "?"), _fire_detail(f)] for f in fires]
    echo_lines(table(rows, header=["TIME", "FIRE", "DETAIL"]))


def _fire_detail(f: dict) -> str:
    """What one fire of the daemon did, in words."""
    fire = as_text(f.get("fire"), "?")
    if fire == "ran":
        return f"session {as_text(f.get('session_id'))}  {as_text(f.get('outcome'))}"
    if fire == "asleep":
        return f"asleep until {as_text(f.get('until'))}"
    if fire == "skipped":
        detail = {"locked": "another wake held the lease",
                  "still_running": "the previous fire was still running"}.get(f.get("reason"),
                                                                           as_text(f.get("reason")))
        if f.get("scheduled"):
            detail += f" (scheduled {as_text(f['scheduled'])})"
        return detail
    if fire == "lease_lost":
        return f"session {as_text(f.get('session_id'))}  stopped: its wake lease was lost"
    if fire == "missed":
        return f"scheduled {as_text(f.get('scheduled'))}"
    if fire == "error":
        return as_text(f.get("error"))
    return " ".join(f"{k}={as_text(v)}" for k, v in f.items() if k not in ("t", "fire"))

