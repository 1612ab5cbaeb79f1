"""What changes while a session runs: its :class:`SessionState`, everything of it that is not fixed.

A session is three things: its :class:`~brainstem.session.build.SessionDeps` (who it is, its store,
budget and stop signals: given when it starts, never reassigned), what is made for it
(:class:`~brainstem.session.build.Session`: the agent's view of the store, the tool policy, the LLM)
and this state. The wake makes the state first, before the session is whole, so a session stopped
before it planned (or before its LLM was made) still ends from it (:func:`.ending.finish`).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from brainstem.core import outcomes


@dataclass(frozen=True)
class Missed:
    """A reflection that did not happen: why, in one line, and the exception its call failed with (a limit,
    a stop, the provider), or None when the model answered and the answer was unusable."""
    error: str
    exc: BaseException | None = None


@dataclass
class SessionState:
    """A session's changing fields, each in one place: what orient is shown, what the session reads,
    shows and queues, and how it ends (its outcome, why, what it asks of the next wake)."""
    context: dict = field(default_factory=dict)  # what orient is shown: ground truth, effort, loaded keys...
    effort: str = "low"  # what orient asks with: the wake's (its tripwires' included), raised by a reflex
    outcome: str = outcomes.CLEAN
    reason: str | None = None  # why it ended so, when the outcome alone does not say (faults, interruptions)
    kind: str = "session"  # "session", "deep_reflect", or "reflex" (a wake a reflex handled)
    next_wake: dict | None = None
    reflect_wake: dict | None = None  # what reflection asked for; wins over the plan's request
    missed: Missed | None = None  # the reflection (or deep reflection) that did not happen, and why
    clean_snapshot: dict | None = None  # the watched keys as this session found them (auto-restore)
    steps_failed: int = 0
    reads: Counter = field(default_factory=Counter)  # keys read this session (memory hygiene)
    # What the session's tools read from the store, each key as first read (None: absent): recorded at
    # its end (events.TOOL_READS), so a replay's tools read the store as this session's did.
    seen: dict[str, str | None] = field(default_factory=dict)
    # The operator's messages this session's context shows (ids), and whether the model answered the
    # orient call that showed them: only then does the end of the session mark them read.
    inbox_ids: list[int] = field(default_factory=list)
    inbox_answered: bool = False
    reviews_queued: int = 0  # runs of supervised tools this session has let through for review
    # The runway the wake found (BRAINSTEM_MIN_RUNWAY_DAYS set): its days, and the stretch of the sleep it asks
    runway: dict | None = None
    _review_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def review_room(self, cap: int) -> str | None:
        """Why another supervised run may not be queued for review (None: it may, and is counted now, so
        runs side by side in an agent step cannot pass the cap together)."""
        with self._review_lock:
            if self.reviews_queued >= cap:
                return (f"this session has queued {cap} runs for review, as many as "
                        f"BRAINSTEM_REVIEW_MAX_PER_SESSION allows")
            self.reviews_queued += 1
        return None
