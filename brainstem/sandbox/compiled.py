"""Compiled tool code, kept by the runtime so that a tool's next call skips RestrictedPython.

Compiling under RestrictedPython is most of what a worker does for a small
tool, and it writes to hundreds of the fork server's pages, each copied
into the worker.  The first call of a source asks its worker to send the
code object (marshalled) *before* any of the tool's code runs; later calls
of the same source carry it, and their workers only load it.

The blob comes from a worker, but from the point in it where the only
thing that has touched the source is the compiler, which is deterministic:
compiling the same source again would give the same code.  It is keyed by
the SHA-256 of the exact source the runtime sent, held in this process's
memory only (never in the store), and bounded in count and bytes.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

MAX_ENTRIES = 256
MAX_BYTES = 16 * 1024 * 1024
MAX_BLOB_CHARS = 1024 * 1024  # one tool's marshalled code, base64: larger ones are compiled each time

_lock = threading.Lock()
_blobs: OrderedDict[str, str] = OrderedDict()
_bytes = 0


def key(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def get(source_key: str) -> str | None:
    with _lock:
        blob = _blobs.get(source_key)
        if blob is not None:
            _blobs.move_to_end(source_key)
        return blob


def put(source_key: str, blob: object) -> None:
    """Keep ``blob`` (base64 text of the marshalled code) for ``source_key``; anything else is ignored."""
    global _bytes
    if type(blob) is not str or not blob or len(blob) > MAX_BLOB_CHARS:
        return
    with _lock:
        if source_key in _blobs:
            return
        _blobs[source_key] = blob
        _bytes += len(blob)
        while _blobs and (len(_blobs) > MAX_ENTRIES or _bytes > MAX_BYTES):
            _, old = _blobs.popitem(last=False)
            _bytes -= len(old)


def clear() -> None:
    global _bytes
    with _lock:
        _blobs.clear()
        _bytes = 0
