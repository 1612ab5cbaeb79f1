"""``brainstem demo``: a whole session, offline, on a throwaway embedded store, from a recorded cassette."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CASSETTE = Path(__file__).with_name("cassette.json")
MESSAGE = "What did you write down? Tell me in one sentence."  # the operator's, left before the session


def run_demo(echo: Callable[[str], None], keep: Path | None = None, cassette: Path = CASSETTE) -> int:
    """Seed an agent, run one session against the cassette, show its karma. Returns an exit code.

    The store lives in a throwaway directory, deleted at the end, unless ``keep`` names a
    directory to keep it in; the cassette is then copied there too, so the kept agent can be woken
    again offline (``brainstem wake --force --llm-cassette DIR/cassette.json``).
    """
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="brainstem-demo-"))
    try:
        return _run(echo, workdir, keep is not None, cassette)
    finally:
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(echo: Callable[[str], None], workdir: Path, kept: bool, cassette: Path) -> int:
    from brainstem.core import keys
    from brainstem.core.settings import OPENROUTER_API, load_settings
    from brainstem.core.timeline import format_entry
    from brainstem.llm.cassette import CassetteProvider
    from brainstem.session.wake import wake
    from brainstem.state import inbox
    from brainstem.state.seed import example_soul_path, seed
    from brainstem.store import open_store, sqlite_url

    workdir.mkdir(parents=True, exist_ok=True)
    if kept:  # the loop goes on after the demo: change a prompt, replay, wake again from the same answers
        kept_cassette = workdir.resolve() / "cassette.json"
        if kept_cassette != cassette.resolve():
            shutil.copyfile(cassette, kept_cassette)
    url = sqlite_url(workdir.resolve() / "demo.db")
    store = open_store(url, prefix="")
    try:
        seed(store, soul_file=example_soul_path())
        where = url if kept else "a throwaway store, deleted when the demo ends (--keep DIR keeps it)"
        echo(f"seeded a new agent (example soul, shipped prompts and tools) in {where}")
        inbox.post(store, MESSAGE)
        echo(f'left it a message, as `brainstem tell "{MESSAGE}"` does')
        echo(f"running one session against the recorded answers in {cassette.name}; no network, no API key\n")
        # No key, the default endpoint and no wallet: the balance checks ask nobody (an operator's
        # OPENROUTER_BASE_URL must not make the offline demo reach for the network).
        settings = load_settings(kv=url, llm_api_key=None, openrouter_api_key=None, wallet_address=None,
                                 llm_base_url=OPENROUTER_API, openrouter_base_url=OPENROUTER_API)
        result = wake(settings, store, force=True, providers=[CassetteProvider(cassette)],
                      listeners=[lambda e: echo("  " + format_entry(e))])
        echo(f"\n{result.message}\n")
        asked = next((m for m in inbox.messages(store) if m["text"] == MESSAGE), None)
        replies = asked["replies"] if asked else []
        echo("its reply to your message, after reading its store with a tool (a reply step; brainstem inbox "
             f"shows it under your message): {replies[0]['text'] if replies else '(none)'}")
        echo(f"your message is {'read' if inbox.read_mark(store) else 'still unread'} (brainstem inbox)")
        last = store.get_json(keys.LAST_REFLECT, default={}) or {}
        echo(f"what it wrote to its memory (last_reflect): {last.get('session_summary', '(nothing)')}")
        echo(f"its note to itself: {last.get('note_to_future_self', '(none)')}\n")
        _schedule(echo, settings, store)
        echo("where to go next:")
        if kept:
            echo(f"  BRAINSTEM_KV={url} brainstem karma --json     # the same session, machine-readable")
            echo(f"  BRAINSTEM_KV={url} brainstem kv ls            # everything the agent is")
            echo(f"  BRAINSTEM_KV={url} brainstem inbox            # your message, its reply, the schedule's notice")
            echo(f"  BRAINSTEM_KV={url} brainstem schedule list    # the schedule, its next run and its last")
            echo(f"  BRAINSTEM_KV={url} brainstem wake --force --llm-cassette {kept_cassette}"
                 "   # another session, offline")
        else:
            echo("  brainstem demo --keep ./demo                  # keep the store, then look around in it")
        echo("  brainstem seed --soul my_soul.md && OPENROUTER_API_KEY=... brainstem wake   # a real agent")
        return 0 if result.outcome == "clean" else 1
    finally:
        store.close()


def _schedule(echo: Callable[[str], None], settings, store) -> None:
    """A scheduled action: the same tool the session used, every hour, its result to the inbox; run once now,
    with no model call (as `brainstem schedule add` and `brainstem schedule run` do)."""
    from brainstem.core.clock import now_utc
    from brainstem.session.schedule_run import run_now
    from brainstem.state import schedules

    plan = schedules.parse("hourly-look", {"tool": "kv_read", "input": {"keys": ["wisdom"]}, "every": "1h",
                                            "notify": "inbox", "created_by": "operator"})
    schedules.save(store, schedules.filled(plan, now_utc()))
    echo("scheduled kv_read every hour, its result to your inbox (as `brainstem schedule add kv_read --input "
         "'{\"keys\": [\"wisdom\"]}' --every 1h --notify inbox` does), and ran it once now, without a session:")
    ran = run_now(settings, store, plan.id)
    echo(f"  {ran.outcome}, ${ran.cost:.4f}, no model call; its karma: brainstem karma {ran.run_id}\n")
