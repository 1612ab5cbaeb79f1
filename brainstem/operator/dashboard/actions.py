"""The dashboard's actions that run the agent: wake now, a dry run, a replay, each the command line's own.

Each is the ``brainstem`` command an operator would type (``wake --force``, ``wake --dry-run``, ``replay
N``), run as a process of its own: the same code, with its lease, budgets, signal handling and sandbox
pool, and a session that takes minutes never holds up the server's event loop (a thread waits for it).
The process gets the dashboard's environment less the dashboard's token, so the runtime that runs the
agent's code never holds it (:mod:`.auth`), and the agent's key prefix when it is not the default agent.

Wake now is ``brainstem wake --force``: a session now, whatever the schedule says, with the outcome line
to show for it. (An urgent ``brainstem tell`` also makes the agent due, but then when it runs is the
daemon's or cron's to decide, and nothing here could say how it went.) The wake lease still holds: with a
session already running, the wake says so (exit 75) and runs nothing.

An action's progress and result live in this process only (the last :data:`KEEP` of them): what a
session did is in its karma, whose page this one links to as soon as the session has an id.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from brainstem.core import environment
from brainstem.core.clock import now_iso
from brainstem.core.errors import BadArgument, LeaseHeld

KEEP = 50  # actions remembered, newest kept
OUTPUT_CHARS = 40_000  # of a replay's report; karma holds a session's whole story
TOKEN_ENV = "BRAINSTEM_DASHBOARD_TOKEN"
# what the page offers -> (its name on the page, the command's arguments)
KINDS = {
    "wake": ("wake now", ["wake", "--force", "--log-format", "json"]),
    "dry_run": ("dry run", ["wake", "--dry-run", "--log-format", "json"]),
    "replay": ("replay", ["replay"]),
}
REPLAY_VERDICTS = {0: "same behaviour", 1: "the behaviour differs", 2: "cannot be replayed"}


@dataclass
class Action:
    id: str
    kind: str
    agent: str
    argv: list[str]
    started_at: str
    target: str | None = None  # the session a replay replays
    state: str = "running"  # running, done
    session_id: str | None = None  # the session a wake started (known from its first karma entry)
    returncode: int | None = None
    outcome: str | None = None
    verdict: str | None = None
    summary: str = ""  # the outcome line, the verdict, or why it failed
    output: str = ""
    ended_at: str | None = None
    _proc: Any = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return KINDS[self.kind][0]

    @property
    def command(self) -> str:
        """The command as the operator would type it (the output format is this module's business)."""
        shown = [a for a in self.argv if a not in ("--log-format", "json")]
        return "brainstem " + " ".join(shown)

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")} | {"name": self.name,
                                                                                   "command": self.command}


def child_env(agent: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an action's process: the dashboard's, less its token, for ``agent``."""
    env = environment.inherited() if environ is None else dict(environ)
    env.pop(TOKEN_ENV, None)
    if agent:  # "" is the default agent of these settings: the environment selects it already
        env["BRAINSTEM_KV_PREFIX"] = agent
    return env


def command_for(kind: str, target: str | None = None) -> list[str]:
    if kind not in KINDS:
        raise BadArgument(f"no action {kind!r} (the dashboard offers: {', '.join(KINDS)})")
    argv = list(KINDS[kind][1])
    if kind == "replay":
        if not target or not target.strip() or target.startswith("-"):
            raise BadArgument("replay needs the session to replay")
        argv.append(target)
    return argv


class Actions:
    """The actions started from this dashboard, one running at a time per agent."""

    def __init__(self, program: list[str] | None = None):
        self.program = program or [sys.executable, "-m", "brainstem"]
        self._lock = threading.Lock()
        self._all: OrderedDict[str, Action] = OrderedDict()

    def get(self, action_id: str) -> Action | None:
        with self._lock:
            return self._all.get(action_id)

    def running(self, agent: str) -> Action | None:
        with self._lock:
            return next((a for a in self._all.values() if a.agent == agent and a.state == "running"), None)

    def recent(self, agent: str, n: int = 5) -> list[Action]:
        with self._lock:
            return [a for a in reversed(self._all.values()) if a.agent == agent][:n]

    def start(self, kind: str, agent: str, target: str | None = None) -> Action:
        """Start ``kind`` for ``agent``; a BadArgument (nothing started) while another of its actions runs."""
        argv = command_for(kind, target)
        with self._lock:
            busy = next((a for a in self._all.values() if a.agent == agent and a.state == "running"), None)
            if busy is not None:
                raise BadArgument(f"{busy.name} ({busy.id}) is still running for this agent; wait for it to end")
            action = Action(id=secrets.token_hex(4), kind=kind, agent=agent, argv=argv, started_at=now_iso(),
                            target=target)
            try:
                action._proc = subprocess.Popen([*self.program, *argv], env=child_env(agent),
                                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True, errors="replace")
            except OSError as exc:  # no such program, no process left: one line, nothing started
                raise BadArgument(f"could not start {action.command}: {exc.strerror or exc}") from None
            self._all[action.id] = action
            while len(self._all) > KEEP:
                oldest = next(iter(self._all))
                if self._all[oldest].state == "running":
                    break
                del self._all[oldest]
        threading.Thread(target=self._follow, args=(action,), name=f"dashboard-{kind}-{action.id}",
                         daemon=True).start()
        return action

    def _follow(self, action: Action) -> None:
        """Read the process's output as it comes (a wake's session id from its first entry), then its end."""
        proc, lines = action._proc, []
        for line in proc.stdout:
            if action.kind == "replay":
                if sum(map(len, lines)) < OUTPUT_CHARS:
                    lines.append(line)
                continue
            entry = _json(line)
            if entry is None:  # a line that is not JSON: an error the command printed
                lines.append(line)
            elif entry.get("event") == "wake_result":
                action.outcome, action.summary = entry.get("outcome"), str(entry.get("message") or "")
                action.session_id = entry.get("session_id") or action.session_id
            elif action.session_id is None and isinstance(entry.get("session_id"), str):
                action.session_id = entry["session_id"]
        action.returncode = proc.wait()
        action.output = "".join(lines)[:OUTPUT_CHARS]
        action.summary = _summary(action)
        action.ended_at = now_iso()
        action.state = "done"


def _json(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _summary(action: Action) -> str:
    """What the page says of an ended action."""
    code = action.returncode
    if action.kind == "replay":
        action.verdict = REPLAY_VERDICTS.get(code if code is not None else -1, f"failed (exit {code})")
        return action.verdict
    if code == LeaseHeld.exit_code:
        return action.summary or "another wake holds the agent's lease (a session is running): nothing was run"
    if action.summary:
        return action.summary
    last = action.output.strip().splitlines()[-1:] or [f"exit {code}"]
    return f"failed (exit {code}): {last[0]}" if code else last[0]
