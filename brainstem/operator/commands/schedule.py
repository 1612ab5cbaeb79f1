"""``brainstem schedule``: the operator's scheduled actions (add, list, rm, pause, resume, run), each one tool
run with a fixed input at set times without a session (:mod:`brainstem.state.schedules`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from brainstem.core import keys
from brainstem.core.errors import BadArgument, ConfigError, NotFound
from brainstem.operator.commands.context import Ctx, pass_ctx
from brainstem.operator.output import as_text, echo_lines, json_lines, print_json, short_time, table, usd

INPUT_EXAMPLE = '--input \'{"url": "https://example.org"}\''


@click.group()
def schedule() -> None:
    """Run one tool at set times, with a fixed input, without a session.

    A schedule costs no model call (unless --synthesize asks for one summary),
    so it is the cheap way to do the same thing regularly: check a price every
    hour, fetch a page each morning. Runs happen under `brainstem run` and at
    each `brainstem wake` (cron), exactly once across hosts; each run's karma is
    kept like a session's. The agent has schedules of its own (its schedule:ID
    keys), within BRAINSTEM_SCHEDULE_MIN_INTERVAL and BRAINSTEM_SCHEDULE_MAX; it
    can never change or remove yours. docs/schedules.md has every field and rule.

    \b
    Examples:
      brainstem schedule add check_or_balance --every 6h --notify inbox
      brainstem schedule add web_fetch --input '{"url": "https://example.org"}' \\
          --cron '0 9 * * MON-FRI' --tz Europe/London --notify telegram \\
          --synthesize 'One line: what changed on this page?'
      brainstem schedule list
      brainstem schedule pause a1b2c3d4 && brainstem schedule resume a1b2c3d4
      brainstem schedule run a1b2c3d4        # now, once
      brainstem schedule rm a1b2c3d4
    """


@schedule.command("add", short_help="Add a schedule; print its id.")
@click.argument("tool")
@click.option("--input", "input_json", default="{}", show_default=True, metavar="JSON",
              help="The tool's input, a JSON object, the same at every run.")
@click.option("--every", metavar="D", help="Run every D of elapsed time: 30m, 6h, 1d (from 1s to 366d).")
@click.option("--cron", metavar="EXPR",
              help="Run at wall-clock times: five fields 'minute hour day month weekday', or @hourly, @daily...")
@click.option("--tz", metavar="ZONE", help="The time zone of --cron, an IANA name (Europe/London). Default: UTC.")
@click.option("--notify", type=click.Choice(["none", "inbox", "telegram"]), default="none", show_default=True,
              help="Where each run's result goes: the inbox (brainstem inbox, the dashboard) or your Telegram chat.")
@click.option("--synthesize", metavar="PROMPT",
              help="Turn the result into the message with one LLM call and this prompt (with --notify).")
@click.option("--missed", type=click.Choice(["skip", "once"]), default="once", show_default=True,
              help="A run missed while nothing ran (the host down): run it once late (within --catchup), or skip it.")
@click.option("--catchup", type=click.IntRange(0, 7 * 86400), default=3600, show_default=True, metavar="SECONDS",
              help="With --missed once: how late a missed run may still run.")
@click.option("--id", "schedule_id", metavar="ID",
              help="Its id (letters, digits, _ and -). Default: 8 random hex digits.")
@click.option("--paused", is_flag=True, help="Add it paused: it runs once you resume it.")
@click.option("--json", "as_json", is_flag=True, help="Print the schedule stored, as one JSON object.")
@pass_ctx
def schedule_add(c: Ctx, tool: str, input_json: str, every: str | None, cron: str | None, tz: str | None,
                 notify: str, synthesize: str | None, missed: str, catchup: int, schedule_id: str | None,
                 paused: bool, as_json: bool) -> None:
    """Add a schedule that runs TOOL with --input at set times; print its id.

    Give exactly one of --every (elapsed time, on the grid of its first run)
    and --cron (wall-clock times in --tz; across a daylight-saving change each
    local time runs once). The tool must exist and --input must fit its input
    schema. The schedule is yours (created_by operator): the agent sees it,
    and can never change or remove it.

    \b
    Examples:
      brainstem schedule add check_or_balance --every 6h --notify inbox
      brainstem schedule add web_fetch --input '{"url": "https://example.org"}' --cron '0 9 * * *' \\
          --tz America/New_York --notify telegram --synthesize 'One line: anything new?'
      brainstem schedule add kv_read --input '{"key": "wisdom"}' --every 1d --id daily-wisdom --missed skip
      id=$(brainstem schedule add check_or_balance --every 1h) && brainstem schedule run "$id"
    """
    from brainstem.core import recurrence
    from brainstem.core.clock import now_utc
    from brainstem.state import schedules

    try:
        recurrence.parse(every, cron, tz)
    except ConfigError as exc:
        raise BadArgument(f"{_as_options(str(exc))} (see docs/schedules.md)") from None
    args = _input(input_json)
    _check_tool(c, tool, args)
    if synthesize is not None and notify == "none":
        raise BadArgument("--synthesize writes the message a run sends: give --notify inbox or --notify telegram too")
    inventory = schedules.load_all(c.store)
    taken = {s.id for s in inventory.schedules} | {schedules.id_of(p.key) or "" for p in inventory.problems}
    if schedule_id is not None:
        schedules.check_id(schedule_id)
        if schedule_id in taken:
            raise BadArgument(f"schedule {schedule_id} exists already; choose another --id, or remove it first "
                              f"(brainstem schedule rm {schedule_id})")
    raw = {"tool": tool, "input": args, "every": every, "cron": cron, "tz": tz, "notify": notify,
           "synthesize": synthesize, "missed": missed, "catchup": catchup, "enabled": not paused,
           "created_by": "operator"}
    new = schedules.parse(schedule_id or schedules.new_id(taken), {k: v for k, v in raw.items() if v is not None})
    new = schedules.filled(new, now_utc())
    schedules.save(c.store, new)
    if as_json:
        print_json(schedules.dump(new))
        return
    click.echo(new.id)
    state = f"paused (brainstem schedule resume {new.id} starts it)" if paused else f"next run {new.next_run}"
    click.echo(f"schedule {new.id}: {tool} {new.when}; {state}", err=True)
    if notify == "telegram" and not c.settings.telegram_polling:
        click.echo("note: Telegram is not set up here (BRAINSTEM_TELEGRAM_BOT_TOKEN and BRAINSTEM_TELEGRAM_CHAT_ID): "
                   "where runs happen, they need both, or each notice fails (in the run's karma)", err=True)


def _as_options(message: str) -> str:
    """A timing error as the options that gave it: ``every '5x' ...`` is ``--every '5x' ...``."""
    for name in ("every", "cron", "tz"):
        if message.startswith(f"{name} "):
            return f"--{message}"
    return message.replace("exactly one of every", "exactly one of --every").replace("and cron", "and --cron")


def _input(text: str) -> dict[str, Any]:
    try:
        args = json.loads(text)
    except ValueError as exc:
        raise BadArgument(f"--input is not valid JSON ({exc}); it must be a JSON object, e.g. {INPUT_EXAMPLE}") \
            from None
    if not isinstance(args, dict):
        raise BadArgument(f"--input must be a JSON object, e.g. {INPUT_EXAMPLE}; got {type(args).__name__}")
    return args


def _check_tool(c: Ctx, name: str, args: dict[str, Any]) -> None:
    """TOOL names a tool in the store, and ``args`` fit its input schema (when it has a usable one)."""
    from brainstem.core.mcp_config import is_mcp
    from brainstem.tools.schema import SchemaError, check_arguments, input_schema
    from brainstem.tools.tool import ToolError, load_tool

    if not name or ":" in name or any(ch.isspace() for ch in name):
        raise BadArgument(f"{name!r} is not a tool's name; `brainstem tool ls` lists them")
    if is_mcp(name):
        _check_mcp_tool(c, name, args)
        return
    try:
        _, meta = load_tool(c.store, name)
    except ToolError as exc:
        if c.store.get(keys.tool_code(name)) is None:
            raise NotFound(f"no tool named {name!r} in {c.store.display_url}; `brainstem tool ls` lists them") \
                from None
        raise BadArgument(f"tool {name} cannot run: {exc}") from None
    try:
        schema = input_schema(meta)
    except SchemaError:
        return  # its runs fail the same way its session steps do; nothing to check against here
    _, problem = check_arguments(schema, json.dumps(args))
    if problem is not None:
        raise BadArgument(f"--input: {problem.replace('the arguments do not fit', 'it does not fit')}")


def _check_mcp_tool(c: Ctx, name: str, args: dict[str, Any]) -> None:
    """An MCP tool: its server lists it, and ``args`` fit the schema it lists."""
    from brainstem.tools import mcp_tools
    from brainstem.tools.policy import ToolPolicy
    from brainstem.tools.schema import check_arguments

    policy = ToolPolicy.from_settings(c.settings)
    try:
        found = mcp_tools.catalog(policy, lambda *a, **k: {}, timeout=c.settings.max_session_seconds)
    finally:
        policy.close()
    if name not in found.tools:
        raise NotFound(f"{name}: {found.why_not(name)}")
    _, problem = check_arguments(found.tools[name].schema, json.dumps(args))
    if problem is not None:
        raise BadArgument(f"--input: {problem.replace('the arguments do not fit', 'it does not fit')}")


@schedule.command("list", short_help="Every schedule, its next run and its last.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per schedule, every field; a value that is not a schedule has error set.")
@pass_ctx
def schedule_list(c: Ctx, as_json: bool) -> None:
    """Every schedule, yours and the agent's: when it runs, its next run and how its last run ended.

    A value under schedule: that is not a schedule is listed as INVALID with
    the reason; it never runs until fixed (brainstem kv put) or removed.

    \b
    Examples:
      brainstem schedule list
      brainstem schedule list --json | jq -r 'select(.created_by == "agent") | .id'
      brainstem karma --json | jq 'select(.event == "schedule_run")'   # what the runs did
    """
    from brainstem.core.clock import now_utc
    from brainstem.state import schedules

    inventory, now = schedules.load_all(c.store), now_utc()
    problems = [(schedules.id_of(p.key), p, p.reason.removeprefix(f"{p.key}: ")) for p in inventory.problems]
    if as_json:
        json_lines([{**s.model_dump(), "error": None} for s in inventory.schedules]
                   + [{"id": i, "key": p.key, "error": why} for i, p, why in problems])
        return
    if not inventory.schedules and not inventory.problems:
        click.echo("no schedules (add one: brainstem schedule add TOOL --every 1h)")
        return
    rows = [[s.id, s.tool, s.when, "on" if s.enabled else "PAUSED", short_time(schedules.upcoming(s, now)),
             _last(s.last_run, s.last_outcome), s.created_by, s.notify] for s in inventory.schedules]
    rows += [[i or p.key, "-", "-", "INVALID", "-", "-", "operator" if p.operator else "-", why]
             for i, p, why in problems]
    echo_lines(table(rows, header=["ID", "TOOL", "WHEN", "STATE", "NEXT RUN (UTC)", "LAST RUN", "BY",
                                                    "NOTIFY"]))


def _last(when: str | None, outcome: str | None) -> str:
    return "never" if when is None and outcome is None else f"{short_time(when)} {as_text(outcome)}"


@schedule.command("rm", short_help="Remove a schedule.")
@click.argument("schedule_id", metavar="ID")
@pass_ctx
def schedule_rm(c: Ctx, schedule_id: str) -> None:
    """Remove schedule ID (yours or the agent's; a run under way finishes).

    \b
    Examples:
      brainstem schedule rm a1b2c3d4
      brainstem schedule list                 # the ids
    """
    from brainstem.state import schedules

    key = keys.schedule(schedules.check_id(schedule_id))
    with _claimed(c, schedule_id):
        if not c.store.delete(key):
            raise _unknown(c, schedule_id)
    click.echo(f"removed schedule {schedule_id}")


@schedule.command("pause", short_help="Pause a schedule.")
@click.argument("schedule_id", metavar="ID")
@pass_ctx
def schedule_pause(c: Ctx, schedule_id: str) -> None:
    """Stop schedule ID from running until it is resumed (a run under way finishes).

    The agent may resume a schedule of its own; to stop one of its for good,
    remove it (brainstem schedule rm ID).

    \b
    Examples:
      brainstem schedule pause a1b2c3d4
      brainstem schedule resume a1b2c3d4
    """
    click.echo(_set_enabled(c, schedule_id, False))


@schedule.command("resume", short_help="Resume a paused schedule.")
@click.argument("schedule_id", metavar="ID")
@pass_ctx
def schedule_resume(c: Ctx, schedule_id: str) -> None:
    """Let paused schedule ID run again, from its next time after now.

    The runs it would have made while paused are not made up for: its next
    run is the first one after now.

    \b
    Examples:
      brainstem schedule resume a1b2c3d4
      brainstem schedule list                 # its next run
    """
    click.echo(_set_enabled(c, schedule_id, True))


def _set_enabled(c: Ctx, schedule_id: str, enabled: bool) -> str:
    from brainstem.core.clock import now_utc, parse_iso
    from brainstem.state import schedules

    schedules.check_id(schedule_id)
    with _claimed(c, schedule_id):
        s = _load(c, schedule_id)
        if s.enabled == enabled:
            return f"schedule {schedule_id} is {'running' if enabled else 'paused'} already"
        update: dict[str, Any] = {"enabled": enabled}
        now, next_run = now_utc(), parse_iso(s.next_run)
        if enabled and (next_run is None or next_run <= now):
            update["next_run"] = schedules.first_run(s.rule, now)  # paused time is not downtime to catch up on
        s = s.model_copy(update=update)
        schedules.save(c.store, s)
    return f"resumed schedule {schedule_id}; next run {s.next_run}" if enabled else f"paused schedule {schedule_id}"


@schedule.command("run", short_help="Run a schedule now, once.")
@click.argument("schedule_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the run's result as one JSON object.")
@pass_ctx
def schedule_run(c: Ctx, schedule_id: str, as_json: bool) -> None:
    """Run schedule ID now, once, as its due runs are run (paused or not).

    Modes, grants, quotas and both spend ceilings apply, and the run's karma
    is kept like any run's. Exit 0 when the run is ok, 1 otherwise (it
    failed, was refused, or its previous run is still running).

    \b
    Examples:
      brainstem schedule run a1b2c3d4
      brainstem schedule run a1b2c3d4 --json | jq .outcome
    """
    _load(c, schedule_id)  # an unknown or broken id is exit 2 before anything runs
    from brainstem.session.schedule_run import run_now

    result = _fields(run_now(c.settings, c.store, schedule_id))
    if as_json:
        print_json(result)
    else:
        cost = f", {usd(result['cost'])}" if isinstance(result.get("cost"), (int, float)) else ""
        why = f": {result['reason']}" if result.get("reason") else ""
        karma = f" (brainstem karma {result['run_id']})" if result.get("run_id") else ""
        click.echo(f"schedule {schedule_id}: {as_text(result.get('outcome'))}{cost}{why}{karma}")
    if result.get("outcome") != "ok":
        raise click.exceptions.Exit(1)


def _fields(result: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    if hasattr(result, "model_dump"):
        return result.model_dump()
    return dict(result)


def _load(c: Ctx, schedule_id: str):
    """The schedule ID; exit 2 when there is none, or what is there is not a schedule."""
    from brainstem.state import schedules

    schedules.check_id(schedule_id)
    try:
        s = schedules.load(c.store, schedule_id)
    except schedules.ScheduleError as exc:
        raise BadArgument(f"{exc} (fix it: brainstem kv get {keys.schedule(schedule_id)}, then kv put; or "
                          f"brainstem schedule rm {schedule_id})") from None
    if s is None:
        raise _unknown(c, schedule_id)
    return s


def _unknown(c: Ctx, schedule_id: str) -> NotFound:
    return NotFound(f"no schedule {schedule_id!r} in {c.store.display_url}; `brainstem schedule list` lists them")


def _claimed(c: Ctx, schedule_id: str):
    """Hold the schedule's claim for an edit, so neither a run nor the edit undoes the other's write."""
    from brainstem.state import schedules

    return schedules.claimed(c.store, [schedule_id], "schedule-cli")
