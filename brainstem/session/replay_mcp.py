"""The operator's MCP servers in a replay: answered from the session's recording, never started."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from typing import Any

from brainstem.core import events
from brainstem.core.mcp_config import tool_name
from brainstem.tools.mcp_client import CallResult, Listing


class RecordedMCP:
    """The operator's MCP servers as a replay sees them: each server's tools as the original session listed
    them (its ``mcp_tools`` entries), and each call answered with what the original call of the same tool
    with the same input got (in order). No server is started: a replay never reaches the world.

    An agent step runs its calls side by side, so the order of their entries was the servers' timing; an
    answer from the recording takes no time. So each call is answered only once the calls that had started
    before it ended in the original have started here, and those that ended before it have been answered
    (or :data:`ORDER_WAIT` has passed: a call the replay never makes holds nothing up for long)."""

    ORDER_WAIT = 1.0

    def __init__(self, recording: Any):
        self.listings: dict[str, Listing] = {}
        for e in recording.rest:
            if e.get("event") == events.MCP_TOOLS and isinstance(e.get("server"), str):
                self.listings.setdefault(e["server"], Listing(e["server"], tools=list(e.get("tools") or []),
                                                              error=e.get("error")))
        self.calls: dict[tuple, deque] = defaultdict(deque)  # (tool, input) -> the recorded calls' numbers
        self.completes: list[dict] = []
        started: dict[tuple, deque] = defaultdict(deque)
        began: list[int] = []  # the position of each recorded call's start, by its number
        self.starts_before: list[set[int]] = []
        self.ends_before: list[set[int]] = []
        for at, e in enumerate(recording.rest):
            if e.get("source") != "mcp":
                continue
            place = (e.get("tool"), e.get("step_id"), e.get("attempt"))
            if e.get("event") == events.TOOL_START:
                started[place].append((len(began), e.get("input")))
                began.append(at)
            elif e.get("event") == events.TOOL_COMPLETE and started[place]:
                number, given = started[place].popleft()
                while len(self.completes) <= number:
                    self.completes.append({})
                    self.starts_before.append(set())
                    self.ends_before.append(set())
                self.completes[number] = e
                self.starts_before[number] = {n for n, b in enumerate(began) if b < at and n != number}
                self.ends_before[number] = {n for n, c in enumerate(self.completes) if c and n != number}
                self.calls[(e.get("tool"), _canonical(given))].append(number)
        self._entered: set[int] = set()
        self._answered: set[int] = set()
        self._turn = threading.Condition()

    @property
    def names(self) -> list[str]:
        return sorted(self.listings)

    def list_all(self, timeout: float) -> dict[str, Listing]:
        return dict(sorted(self.listings.items()))

    def list_tools(self, server: str, timeout: float) -> Listing:
        return self.listings.get(server) or Listing(server, error="the original session did not list this server")

    def timeout_of(self, server: str) -> float:
        return self.ORDER_WAIT + 1.0  # answered from the recording

    def call_tool(self, server: str, tool: str, args: dict, timeout: float) -> CallResult:
        queue = self.calls.get((tool_name(server, tool), _canonical(args)))
        if not queue:
            return CallResult(False, error="replay: the original session made no such MCP call (this tool with "
                                           "this input); a replay never reaches the world")
        number = queue.popleft()
        with self._turn:
            self._entered.add(number)
            self._turn.notify_all()
            self._turn.wait_for(lambda: self.starts_before[number] <= self._entered
                                and self.ends_before[number] <= self._answered, timeout=self.ORDER_WAIT)
        if self.ends_before[number]:
            time.sleep(0.01)  # the call answered before it records its end first
        with self._turn:
            self._answered.add(number)
            self._turn.notify_all()
        e = self.completes[number]
        return CallResult(bool(e.get("ok")), value=e.get("result"), error=e.get("error"))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
