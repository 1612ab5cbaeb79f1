"""The pool: workers forked and locked down before a call needs one.

A call takes a ready worker, whose fork, lock-down and warm-up are behind it,
and sends it the job; while the job runs the pool asks the fork server for a
replacement (one message: the fork happens in the server, off the caller's
path).  A worker still runs exactly one call and then dies, so nothing of one
call reaches the next; every protection is in place before the worker ever
sees a job, and a job's limits only lower the ones it was locked down with.

There is no pool until the first call of a process. The pool is the
process's, shared by whatever uses it at once (:func:`use`: each session, and
``brainstem run`` for as long as it runs): the first user sets its size
(``BRAINSTEM_SANDBOX_POOL``; 0 forks each worker when its call comes) and the
last to leave gives the workers back (:func:`drain`), so one session's end
never empties the workers another is about to take, and a process that has
stopped using the pool holds none.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from brainstem.sandbox.fork_client import Worker, fork_worker

DEFAULT_SIZE = 4
MAX_SIZE = 64

_lock = threading.Lock()
_ready: deque[Worker] = deque()
_size = DEFAULT_SIZE
_memory_mb = 0  # what the pool's workers are locked down with: the last call's
_ordered = 0  # workers being asked for by refill() right now
_users = 0  # callers inside use() now
_use_lock = threading.Lock()  # held while a first user configures or a last one drains


def configure(size: int) -> None:
    """Hold ``size`` ready workers from the next call on (0: none); drains any beyond it."""
    global _size
    if not 0 <= size <= MAX_SIZE:
        raise ValueError(f"pool size must be between 0 and {MAX_SIZE}")
    with _lock:
        _size = size
        extra = [_ready.pop() for _ in range(max(0, len(_ready) - size))]
    for worker in extra:
        worker.close()


@contextmanager
def use(size: int) -> Iterator[None]:
    """Hold the pool while the caller works: the first user sets its size (:func:`configure`), later ones
    share it as it is, and the last to leave drains it."""
    global _users
    with _use_lock:
        if _users == 0:
            configure(size)
        _users += 1
    try:
        yield
    finally:
        with _use_lock:
            _users -= 1
            if _users == 0:
                drain()


def users() -> int:
    """How many callers are inside :func:`use` now (for diagnostics and tests)."""
    return _users


def size() -> int:
    return _size


def take(memory_mb: int) -> Worker:
    """A worker for one call: a ready one locked down with at least ``memory_mb``, else a new one.

    Call :func:`refill` once the job is on its way.
    """
    global _memory_mb
    dead: list[Worker] = []
    found = None
    with _lock:
        _memory_mb = memory_mb
        while _ready:
            worker = _ready.popleft()
            if worker.memory_mb >= memory_mb and worker.usable():
                found = worker
                break
            dead.append(worker)  # ended, from a server since restarted, or locked down with too little memory
    for worker in dead:
        worker.close()
    return found if found is not None else fork_worker(memory_mb)


def refill() -> None:
    """Order what the pool lacks; the fork server forks them while the caller's job runs."""
    global _ordered
    with _lock:
        n = _size - len(_ready) - _ordered
        if n <= 0 or not _memory_mb:
            return
        _ordered += n
        memory_mb = _memory_mb
    forked = 0
    try:
        for _ in range(n):
            worker = fork_worker(memory_mb)
            with _lock:
                _ready.append(worker)
                _ordered -= 1  # now counted among the ready
            forked += 1
    finally:
        with _lock:
            _ordered -= n - forked


def drain() -> None:
    """Give back every ready worker (each reads the end of its channel and exits)."""
    with _lock:
        workers = list(_ready)
        _ready.clear()
    for worker in workers:
        worker.close()


def ready() -> list[Worker]:
    """The workers waiting now (for diagnostics and tests)."""
    with _lock:
        return list(_ready)
