"""``brainstem replay``: a recorded session run again against today's prompts, config and tools."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from brainstem.core.errors import BadArgument
from brainstem.operator.output import echo_lines, print_json


@click.command()
@click.argument("session_ref", metavar="[SESSION]", required=False)
@click.option("--since", "since", metavar="N",
              help="Replay every session from N (a number or an id) on, one line each; exit 1 if any differs.")
@click.option("--live", is_flag=True,
              help="Where a request differs from the recorded one, ask the model (priced, within the budgets, "
                   "counted towards today's spend; the replay's karma is then kept as replay-ID).")
@click.option("--llm-cassette", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="With --live: answer changed requests from this recorded cassette instead of the model "
                   "(offline, no API key; simulated spend, never today's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: old beside new for every part.")
@click.pass_obj
def replay(c, session_ref: str | None, since: str | None, live: bool, llm_cassette: Path | None,
           as_json: bool) -> None:
    """Replay SESSION (an id or a number) against today's prompts, config, tools and code.

    The session runs again with everything it saw (the operator's messages,
    the time, balances, the keys it loaded, crash data, what deep reflection
    was shown of memory, as its karma recorded them), so only a change of the
    agent can change what it does. Nothing changes: writes go to a throwaway
    overlay, fetches are answered with what the session received, no message
    or reply is sent, the schedule and session history stay as they are.
    Wherever a request to the model is the same as recorded, the recorded
    answer is used; a request that differs is reported as changed_request
    with a unified diff of its prompt text (recorded against now), or asked
    live with --live. Prints the plan, every step's outcome, the store
    writes, the cost and the reflection, old beside new.

    --since N replays every session from N on, one line each (a session that
    cannot be replayed is skipped, with why), then the diff of each changed
    request; --json then prints {"sessions": [{"id", "verdict",
    "differences"}]}.

    Exit codes: 0 the behaviour is the same, 1 it differs, 2 the session
    cannot be replayed (unknown, its karma trimmed, recorded by an older
    version, unfinished, a wake a reflex handled) or no session is from N on.

    \b
    Examples:
      brainstem replay 12                 # after editing prompt:orient: same?
      brainstem replay 12-a1b2c3 --json   # for scripts
      brainstem replay --since 1          # every session there is, one line each
      brainstem replay 12 --live          # ask the model where the prompt changed
      brainstem replay 12 --live --llm-cassette demo/cassette.json   # ask the cassette instead
    """
    from brainstem.sandbox import pool

    if llm_cassette is not None and not live:
        raise BadArgument("--llm-cassette answers a replay's live calls: add --live")
    if (session_ref is None) == (since is None):
        raise BadArgument("name one session (brainstem replay N) or where to start (brainstem replay --since N)")
    with pool.use(c.settings.sandbox_pool):  # the tool calls replayed get the workers a session's would
        if since is None:
            report = _one(c, session_ref, live, llm_cassette)
            if as_json:
                print_json(report, sort_keys=True)
            else:
                from brainstem.session.replay_report import render

                echo_lines(render(report))
            sys.exit(0 if report["same"] else 1)
        rows = _since(c, since, live, llm_cassette)
    if as_json:
        print_json({"sessions": rows}, sort_keys=True)
    else:
        echo_lines(_since_lines(rows, since))
    sys.exit(1 if any(r["verdict"] == "differs" for r in rows) else 0)


def _one(c, ref: str, live: bool, llm_cassette: Path | None) -> dict:
    """The report on one session; its recording that cannot be replayed raises ReplayError."""
    from brainstem.session.replay import load, rerun
    from brainstem.session.replay_report import compare

    recording = load(c.store, ref)
    cassette = None
    if llm_cassette is not None:  # each session's replay from the cassette's first answer, as a wake's
        from brainstem.llm.cassette import CassetteProvider

        cassette = CassetteProvider(llm_cassette)
    return compare(rerun(c.settings, c.store, recording, live=live, cassette=cassette))


def _since(c, since: str, live: bool, llm_cassette: Path | None) -> list[dict]:
    """One row per session from ``since`` on: its verdict and what differs, or why it was skipped."""
    from brainstem.session.replay import ReplayError, sessions_since

    ids = sessions_since(c.store, since)
    if not ids:
        raise BadArgument(f"no session from {since!r} on: `brainstem sessions` lists the sessions there are")
    rows = []
    for sid in ids:
        try:
            report = _one(c, sid, live, llm_cassette)
        except ReplayError as exc:
            rows.append({"id": sid, "verdict": "skipped", "reason": str(exc), "differences": []})
            continue
        rows.append({"id": sid, "verdict": "same" if report["same"] else "differs", "differs": report["differs"],
                     "answers": report["answers"], "differences": report["differences"],
                     "karma": report["karma"]})
    return rows


def _since_lines(rows: list[dict], since: str) -> list[str]:
    width = max(len(r["id"]) for r in rows)
    lines = [f"replay of {len(rows)} session(s) from {since} on against today's prompts, config, tools and code"]
    for r in rows:
        if r["verdict"] == "skipped":
            said = f"skipped: {r['reason']}"
        elif r["verdict"] == "same":
            said = "same behaviour"
        else:
            said = "DIFFERS in " + ", ".join(r["differs"])
        lines.append(f"{r['id']:<{width}}  {said}")
    for r in rows:
        for d in r["differences"]:
            if d["part"] == "request":
                lines += ["", f"{r['id']}: changed request: {d['purpose']}"
                          + (f" (step {d['step_id']})" if d.get("step_id") else ""), *d["diff"].splitlines()]
        if r.get("karma"):
            lines.append(f"{r['id']}: live calls were made: their karma is kept as {r['karma']}")
    differ = sum(r["verdict"] == "differs" for r in rows)
    skipped = sum(r["verdict"] == "skipped" for r in rows)
    lines += ["", f"result: {len(rows) - differ - skipped} same, {differ} differ, {skipped} skipped"]
    return lines
