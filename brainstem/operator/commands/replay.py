"""``brainstem replay``: a recorded session run again against today's prompts, config and tools."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from brainstem.core.errors import BadArgument
from brainstem.operator.output import echo_lines, print_json


@click.command()
@click.argument("session_ref", metavar="SESSION")
@click.option("--live", is_flag=True,
              help="Where a request differs from the recorded one, ask the model (priced, within the budgets, "
                   "counted towards today's spend; the replay's karma is then kept as replay-ID).")
@click.option("--llm-cassette", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="With --live: answer changed requests from this recorded cassette instead of the model "
                   "(offline, no API key; simulated spend, never today's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: old beside new for every part.")
@click.pass_obj
def replay(c, session_ref: str, live: bool, llm_cassette: Path | None, as_json: bool) -> None:
    """Replay SESSION (an id or a number) against today's prompts, config, tools and code.

    The session runs again with the context it saw (ground truth, effort, the
    keys it loaded, crash data, as its karma recorded them). Nothing changes:
    writes go to a throwaway overlay, fetches are answered with what the
    session received, the schedule and session history stay as they are.
    Wherever a request to the model is the same as recorded, the recorded
    answer is used; a request that differs is reported as changed_request,
    or asked live with --live. Prints the plan, every step's outcome, the
    store writes, the cost and the reflection, old beside new.

    Exit codes: 0 the behaviour is the same, 1 it differs, 2 the session
    cannot be replayed (unknown, its karma trimmed, recorded by an older
    version, a deep reflection, a dry run).

    \b
    Examples:
      brainstem replay 12                 # after editing prompt:orient: same?
      brainstem replay 12-a1b2c3 --json   # for scripts
      brainstem replay 12 --live          # ask the model where the prompt changed
      brainstem replay 12 --live --llm-cassette demo/cassette.json   # ask the cassette instead
    """
    from brainstem.sandbox import pool
    from brainstem.session.replay import load
    from brainstem.session.replay import rerun as run_replay
    from brainstem.session.replay_report import compare, render

    if llm_cassette is not None and not live:
        raise BadArgument("--llm-cassette answers a replay's live calls: add --live")
    cassette = None
    if llm_cassette is not None:
        from brainstem.llm.cassette import CassetteProvider

        cassette = CassetteProvider(llm_cassette)
    recording = load(c.store, session_ref)
    with pool.use(c.settings.sandbox_pool):  # the tool calls replayed get the workers a session's would
        report = compare(run_replay(c.settings, c.store, recording, live=live, cassette=cassette))
    if as_json:
        print_json(report, sort_keys=True)
    else:
        echo_lines(render(report))
    sys.exit(0 if report["same"] else 1)
