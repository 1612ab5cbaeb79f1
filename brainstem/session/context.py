"""What orient sees of the store: the keys it asked to load, and an index of the rest.

Both are bounded, so a prompt stays the same size after 10,000 sessions as
after 10: each loaded value is capped, the number of loaded keys is capped,
secrets are never loaded, and past a cap the index is summarised by prefix.

Both are untrusted, and marked so as they are read (rendered in a trust
boundary, see :mod:`brainstem.core.untrusted`). Every loaded value is, whoever
wrote it: a ``tooldata:*`` key is tool output; ``notes:*`` and ``wisdom`` are
the agent's own words, written by a model that had tool output and fetched
text in front of it and may quote it; and the store keeps no trustworthy
record of who last wrote a key (a tool under ``read_all`` reads everything,
the agent's ``kv_operations`` write almost anything). The orient prompt
already tells the model that loaded keys are data, never orders; the wrapper
makes that hold for the text itself. Key names are untrusted too: a tool
chooses the names under its prefix, and a name may carry up to 512
characters of any text, so the index is marked as a whole.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from brainstem.core import events, keys
from brainstem.core.clock import now_utc
from brainstem.core.errors import NotText
from brainstem.core.templates import PLACEHOLDER, to_text
from brainstem.core.untrusted import PLAIN_NAME, Untrusted, untrusted
from brainstem.state import inbox, schedules
from brainstem.store.base import Store

NEVER_LOADED_PREFIXES = (keys.SECRET_PREFIX, "karma:", "__")
MAX_SCHEDULES_SHOWN = 50  # more than an agent may have by default, and a bound on the prompt whatever is stored
MAX_INPUT_CHARS = 300  # of each schedule's input, as JSON


def load_keys(store: Store, names: list[Any], max_keys: int, max_bytes: int) -> tuple[dict[str, Any], list[Any]]:
    """(values by key, notes). Values are text, capped at ``max_bytes`` characters, each marked
    ``Untrusted(value, "kv:NAME")``; a note that names a key with odd characters is marked too."""
    out: dict[str, Any] = {}
    notes: list[Any] = []

    def note(name: str, text: str) -> None:
        notes.append(text if PLAIN_NAME.fullmatch(name) else Untrusted(text, "kv:load_keys"))

    seen = []
    for name in names:
        if isinstance(name, str) and name not in seen:
            seen.append(name)
    if len(seen) > max_keys:
        notes.append(f"asked to load {len(seen)} keys; loaded the first {max_keys}")
        seen = seen[:max_keys]
    for name in seen:
        if name.startswith(NEVER_LOADED_PREFIXES) or name == keys.SOUL:
            note(name, f"{name}: not loadable into a prompt")
            continue
        try:
            value = store.get(name)
        except NotText as exc:  # a key the agent cannot read must not stop it from planning
            note(name, f"{name}: {exc}")
            continue
        if value is None:
            note(name, f"{name}: no such key")
            continue
        if len(value) > max_bytes:
            value = value[:max_bytes] + f"... [{len(value) - max_bytes} more chars; read the key with kv_read]"
        out[name] = Untrusted(value, f"kv:{name}")
    return out, notes


def kv_index(store: Store, max_keys: int) -> Untrusted:
    """Key names (no values). Past ``max_keys`` names, counts by first segment instead.

    Marked untrusted as a whole (``.value`` is the index itself): tools choose key names.
    """
    names = [k.name for k in store.list_all(limit=max_keys * 50) if not k.name.startswith(keys.BOOKKEEPING_PREFIXES)]
    logs = [n for n in names if n.startswith("karma:")]
    others = [n for n in names if not n.startswith("karma:")]
    index: dict[str, Any] = {"karma_logs": len(logs)}
    if len(others) <= max_keys:
        index["keys"] = others
    else:
        index["keys_by_prefix"] = dict(Counter(n.split(":", 1)[0] + (":*" if ":" in n else "") for n in others))
        index["note"] = f"{len(others)} keys; summarised by prefix. List one prefix with a tool to see names."
    return Untrusted(index, "kv:key-index")


def schedules_context(store: Store, limits: schedules.Limits, now: datetime) -> dict[str, Any]:
    """The agent's schedules, the operator's among them, as orient plans around them: what each runs, when,
    its next run and how its last run ended; and the operator's limits on its own.

    The list is marked untrusted: the agent wrote most of it (a tool's input may quote what a tool
    returned), and a value under ``schedule:`` that is not a schedule is shown with why."""
    inventory = schedules.load_all(store)
    rows: list[dict[str, Any]] = []
    for s in inventory.schedules[:MAX_SCHEDULES_SHOWN]:
        shown = to_text(s.input)
        row: dict[str, Any] = {"id": s.id, "tool": s.tool, "input": s.input if len(shown) <= MAX_INPUT_CHARS
                               else shown[:MAX_INPUT_CHARS] + "... [capped]", "when": s.when,
                               "created_by": s.created_by, "enabled": s.enabled,
                               "next_run": schedules.upcoming(s, now), "last_run": s.last_run,
                               "last_outcome": s.last_outcome, "notify": s.notify}
        rows.append(row)
    rows += [{"id": schedules.id_of(p.key), "error": p.reason, **({"created_by": "operator"} if p.operator else {})}
             for p in inventory.problems[:MAX_SCHEDULES_SHOWN - len(rows)]]
    out: dict[str, Any] = {"yours": inventory.agent_count(), "most_you_may_have": limits.max_count,
                           "shortest_interval_seconds": limits.min_interval,
                           "schedules": Untrusted(rows, "kv:schedule:*")}
    hidden = len(inventory.schedules) + len(inventory.problems) - len(rows)
    if hidden > 0:
        out["note"] = f"{hidden} more not shown"
    return out


def load_session_context(session) -> None:
    """Fill orient's context (the session's ``state.context``): the keys the last reflection asked to load
    (or the defaults), the last reflection, a bounded index of the store, the effort, the operator's messages
    and the schedules."""
    deps, state = session.deps, session.state
    context = state.context
    d = deps.defaults.memory
    last = deps.store.get_json(
        keys.LAST_REFLECT, default=None,
        on_error=lambda e: session.record(events.CONFIG_REJECTED, key=keys.LAST_REFLECT, reason=str(e)))
    names = None
    if isinstance(last, dict):
        noc = last.get("next_orient_context")
        if isinstance(noc, dict) and isinstance(noc.get("load_keys"), list):
            names = noc["load_keys"]
    loaded, notes = load_keys(deps.store, names if names is not None else d.default_load_keys,
                              d.max_load_keys, d.max_load_key_bytes)
    state.reads.update(loaded.keys())
    context["additionalContext"] = loaded
    if notes:
        context["additionalContextNotes"] = notes
    context["lastReflect"] = untrusted(_capped(last, 4000), "memory:last_reflect")  # may quote tool output
    context["kvIndex"] = kv_index(deps.store, d.kv_index_max_keys)
    context["effort"] = state.effort
    # The operator's unread messages. Not wrapped as untrusted: they are the operator's own words, to be
    # acted on, not data. Each text is sanitised and quoted (see inbox.prompt_text), and the ids shown are
    # kept, so the end of the session marks read exactly these and no message that arrived meanwhile.
    shown, more = inbox.for_session(deps.store)
    context["inbox"] = inbox.prompt_text(shown, more)
    state.inbox_ids = [m["id"] for m in shown]
    context["schedules"] = schedules_context(deps.store, schedules.Limits.from_settings(deps.settings), now_utc())


INBOX_SECTION = """

## Messages from your operator

{{context.inbox}}

(The runtime adds these here: this prompt has no place of its own for them. They are your operator's own
words, not data: act on them in this plan, an urgent one first. Answer as asked above: one JSON object.)
"""


def with_inbox(template: str, context: dict) -> str:
    """The orient template, with the operator's messages added at its end when there are some and it has
    no place for them (``{{context.inbox}}`` or the whole ``{{context}}``): whatever the agent has made of
    its prompt, or a store seeded before the inbox existed, it is shown what its operator said."""
    text = context.get("inbox")
    if not isinstance(text, str) or text == inbox.NO_MESSAGES:
        return template
    if any(m.group(1) in ("context", "context.inbox") for m in PLACEHOLDER.finditer(template)):
        return template
    return template + INBOX_SECTION


def _capped(value: Any, chars: int) -> Any:
    text = to_text(value) if value is not None else None
    if text is None or len(text) <= chars:
        return value
    return text[:chars] + "... [capped]"
