"""Length-prefixed JSON frames, and the exact-type JSON conversion.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8
JSON.  Both ends cap the size they accept.  Only plain JSON crosses a process
boundary: the worker converts values with :func:`to_plain` (exact types, so a
``str`` subclass with a lying ``__eq__`` or a dict with non-``str`` keys never
passes), the other end re-parses the bytes with its own ``json.loads``.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_DEPTH = 64
# The runtime's requests to the fork server: (op, worker id, memory_mb or timeout_ms), as fixed numbers.
CONTROL = struct.Struct("<BQI")
FORK, START, REPORT = 1, 2, 3
# ctx requests the worker does not wait on: the runtime handles them in order, and one it cannot handle
# ends the call there (a log line never goes missing unnoticed).
ONE_WAY = frozenset({"log"})


class FrameTooLarge(Exception):
    pass


class NotJSON(ValueError):
    """A value is not plain JSON; the message says what and where."""


def dumps(obj: Any) -> bytes:
    """Serialise plain JSON (no NaN); lone surrogates pass through as such."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def loads(data: bytes) -> Any:
    """Parse a frame body from the other side (invalid UTF-8 is replaced, NaN refused)."""
    return json.loads(data.decode("utf-8", "replace"), parse_constant=_reject_constant)


def encode_frame(obj: Any, max_bytes: int | None = None) -> bytes:
    body = dumps(obj)
    if max_bytes is not None and len(body) > max_bytes:
        raise FrameTooLarge(f"message of {len(body)} bytes exceeds the {max_bytes}-byte limit")
    return HEADER.pack(len(body)) + body


# ------------------------------------------------------------------ fd helpers (worker side)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytes | None:
    """Read exactly n bytes, or None on EOF."""
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame_fd(fd: int, max_bytes: int) -> Any:
    """Blocking read of one frame from a raw fd; None on EOF."""
    head = read_exact(fd, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > max_bytes:
        raise FrameTooLarge(f"incoming message of {size} bytes exceeds the {max_bytes}-byte limit")
    body = read_exact(fd, size)
    if body is None:
        return None
    return loads(body)


# ------------------------------------------------------------------ exact-type conversion


def _type_name(x: Any) -> str:
    name = type(x).__name__
    if type(name) is not str:  # pragma: no cover - defensive
        name = "object"
    return name[:60]


def to_plain(value: Any, *, max_bytes: int, what: str = "result") -> Any:
    """Return a copy of ``value`` made only of exact JSON types, or raise NotJSON.

    Checks ``type(x) is T`` (never isinstance), dict keys exactly ``str``,
    finite floats, nesting depth <= MAX_DEPTH, and an estimated encoded size
    <= max_bytes (the caller re-checks the real encoded size).
    """
    budget = [max_bytes]

    def at(path: str) -> str:
        return "" if path == what else f" at {path}"

    def spend(n: int, path: str) -> None:
        budget[0] -= n
        if budget[0] < 0:
            raise NotJSON(f"{what} too large (more than {max_bytes} bytes)")

    def conv(x: Any, depth: int, path: str) -> Any:
        t = type(x)
        if x is None or x is True or x is False:
            spend(5, path)
            return x
        if t is str:
            spend(len(x) + 2, path)
            return x
        if t is int:
            if x.bit_length() > 10_000:
                raise NotJSON(f"{what} is not JSON: integer too large{at(path)}")
            spend(x.bit_length() // 3 + 2, path)
            return x
        if t is float:
            if math.isnan(x):
                raise NotJSON(f"{what} is not JSON: NaN is not allowed{at(path)}")
            if math.isinf(x):
                raise NotJSON(f"{what} is not JSON: Infinity is not allowed{at(path)}")
            spend(24, path)
            return x
        if depth >= MAX_DEPTH:
            raise NotJSON(f"{what} is not JSON: nested deeper than {MAX_DEPTH} levels")
        if t is list or t is tuple:
            spend(2, path)
            out = []
            for i, item in enumerate(list.__iter__(x) if t is list else tuple.__iter__(x)):
                spend(1, path)
                out.append(conv(item, depth + 1, f"{path}[{i}]"))
            return out
        if t is dict:
            spend(2, path)
            out_d: dict[str, Any] = {}
            for k, v in dict.items(x):
                if type(k) is not str:
                    raise NotJSON(
                        f"{what} is not JSON: dict key of type {_type_name(k)} is not allowed{at(path)}"
                    )
                spend(len(k) + 4, path)
                out_d[k] = conv(v, depth + 1, f"{path}[{k[:30]!r}]")
            return out_d
        raise NotJSON(f"{what} is not JSON: {_type_name(x)} is not allowed{at(path)}")

    return conv(value, 0, what)
