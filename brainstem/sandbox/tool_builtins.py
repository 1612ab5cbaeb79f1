"""What tool code finds without asking: its builtins, and through ``__import__`` eight prepared modules.

* builtins are ``safe_builtins`` minus ``id``, ``SystemExit``,
  ``KeyboardInterrupt`` and ``GeneratorExit``, plus useful ones.  The
  builtins RestrictedPython 9 deliberately removed because they iterate in C
  past ``_getiter_`` (``bytes``, ``sorted``, ``tuple``, ``zip``,
  ``reversed``) are not re-added as such: like every other iterating builtin
  we offer (``list``, ``dict``, ``set``, ``min``, ``sum`` ...), they are
  wrappers that pass their argument through ``_getiter_`` first.
  ``isinstance``/``issubclass`` understand those wrappers as the types they
  stand for (``isinstance(x, (list, tuple))`` works).
* ``__import__`` knows eight names and returns a prepared namespace for each,
  never a real module: real modules lead back to ``sys``, ``os`` and the
  builtins.  A namespace is an instance of a slot-less class whose attributes
  are the chosen functions (staticmethods), classes and constants; it has no
  ``__name__`` (so ``from json import decoder`` cannot fall back to
  ``sys.modules['json.decoder']``) and refuses attribute writes.

Both are built once, at import, in the fork server before it forks.
"""

from __future__ import annotations

import base64 as _base64
import builtins
import datetime as _datetime
import hashlib as _hashlib
import json as _json
import math as _math
import random as _random
import re as _re
import time as _time
import types
from typing import Any

from RestrictedPython import safe_builtins

from brainstem.sandbox.guards import (
    guarded_delattr,
    guarded_getattr,
    guarded_hasattr,
    guarded_iter,
    guarded_setattr,
)

ALLOWED_MODULES = ("json", "re", "math", "datetime", "random", "hashlib", "base64", "time")

# Builtins safe_builtins offers that we take away.
REMOVED_BUILTINS = frozenset({"id", "SystemExit", "KeyboardInterrupt", "GeneratorExit"})

# --------------------------------------------------------------------------- builtins

_WRAPPED_TYPES: dict[int, type] = {}


def _stands_for(t: type):
    def deco(fn):
        _WRAPPED_TYPES[id(fn)] = t
        fn.__name__ = t.__name__
        fn.__qualname__ = t.__name__
        return fn
    return deco


@_stands_for(list)
def g_list(iterable=(), /):
    return builtins.list(guarded_iter(iterable))


@_stands_for(tuple)
def g_tuple(iterable=(), /):
    return builtins.tuple(guarded_iter(iterable))


@_stands_for(set)
def g_set(iterable=(), /):
    return builtins.set(guarded_iter(iterable))


@_stands_for(frozenset)
def g_frozenset(iterable=(), /):
    return builtins.frozenset(guarded_iter(iterable))


@_stands_for(dict)
def g_dict(*args, **kwargs):
    if len(args) > 1:
        raise TypeError(f"dict expected at most 1 argument, got {len(args)}")
    if not args:
        return builtins.dict(**kwargs)
    src = args[0]
    if builtins.isinstance(src, (dict, types.MappingProxyType)) or guarded_hasattr(src, "keys"):
        pairs = [(k, src[k]) for k in guarded_iter(src.keys())]
    else:
        pairs = guarded_iter(src)
    return builtins.dict(pairs, **kwargs)


@_stands_for(bytes)
def g_bytes(source=b"", encoding=None, errors=None):
    if encoding is not None:
        return builtins.bytes(source, encoding, errors or "strict")
    if builtins.isinstance(source, (int, bytes, str)):
        return builtins.bytes(source)
    return builtins.bytes(builtins.list(guarded_iter(source)))


@_stands_for(enumerate)
def g_enumerate(iterable, start=0):
    return builtins.enumerate(guarded_iter(iterable), start)


@_stands_for(zip)
def g_zip(*iterables, strict=False):
    return builtins.zip(*[guarded_iter(i) for i in iterables], strict=strict)


@_stands_for(map)
def g_map(function, *iterables):
    return builtins.map(function, *[guarded_iter(i) for i in iterables])


@_stands_for(filter)
def g_filter(function, iterable):
    return builtins.filter(function, guarded_iter(iterable))


@_stands_for(reversed)
def g_reversed(seq):
    if builtins.type(seq) in (list, tuple, str, range, bytes):
        return builtins.reversed(seq)
    return builtins.reversed(builtins.list(guarded_iter(seq)))


def g_sorted(iterable, /, *, key=None, reverse=False):
    return builtins.sorted(guarded_iter(iterable), key=key, reverse=reverse)


def _min_max(fn, args, kwargs):
    if len(args) == 1:
        return fn(guarded_iter(args[0]), **kwargs)
    return fn(*args, **kwargs)


def g_min(*args, **kwargs):
    return _min_max(builtins.min, args, kwargs)


def g_max(*args, **kwargs):
    return _min_max(builtins.max, args, kwargs)


def g_sum(iterable, /, start=0):
    return builtins.sum(guarded_iter(iterable), start)


def g_any(iterable):
    return builtins.any(guarded_iter(iterable))


def g_all(iterable):
    return builtins.all(guarded_iter(iterable))


def g_iter(*args):
    if len(args) == 1:
        return guarded_iter(args[0])
    return builtins.iter(*args)


def _real_types(t):
    if builtins.type(t) is tuple:
        return builtins.tuple(_real_types(x) for x in t)
    return _WRAPPED_TYPES.get(id(t), t)


def g_isinstance(obj, classinfo, /):
    return builtins.isinstance(obj, _real_types(classinfo))


def g_issubclass(cls, classinfo, /):
    return builtins.issubclass(_real_types(cls), _real_types(classinfo))


def _build_builtins() -> dict[str, Any]:
    b = {k: v for k, v in safe_builtins.items() if k not in REMOVED_BUILTINS}
    # safe_builtins maps _getattr_ to a None-returning safer_getattr; ours raises.
    b.pop("_getattr_", None)
    b.update(
        {
            # type-like wrappers (iterate through _getiter_)
            "list": g_list, "tuple": g_tuple, "set": g_set, "frozenset": g_frozenset,
            "dict": g_dict, "bytes": g_bytes, "enumerate": g_enumerate, "zip": g_zip,
            "map": g_map, "filter": g_filter, "reversed": g_reversed,
            # iterating functions
            "sorted": g_sorted, "min": g_min, "max": g_max, "sum": g_sum,
            "any": g_any, "all": g_all, "iter": g_iter, "next": builtins.next,
            # introspection that stays inside the guards
            "isinstance": g_isinstance, "issubclass": g_issubclass,
            "getattr": guarded_getattr, "hasattr": guarded_hasattr,
            "setattr": guarded_setattr, "delattr": guarded_delattr,
            # plain values
            "str": str, "int": int, "float": float, "bool": bool, "repr": repr,
            "len": len, "range": range, "abs": abs, "round": round, "bin": bin,
            "ascii": ascii, "NotImplemented": NotImplemented,
        }
    )
    # Re-assert the deny list: none of these may ever be a builtin of tool code.
    for name in ("eval", "exec", "compile", "open", "type", "vars", "dir", "globals", "locals",
                 "breakpoint", "help", "exit", "quit", "input", "memoryview", "bytearray",
                 "super", "object", "classmethod", "staticmethod", "property",
                 "ExceptionGroup", "BaseExceptionGroup", "__loader__", "__spec__",
                 *REMOVED_BUILTINS):
        b.pop(name, None)
    b["__import__"] = guarded_import
    return b


# --------------------------------------------------------------------------- modules


def _readonly_setattr(self, name, value):
    raise AttributeError("sandbox modules are read-only")


def _readonly_delattr(self, name):
    raise AttributeError("sandbox modules are read-only")


def _missing_attribute(name: str):
    def __getattr__(self, attr):
        raise AttributeError(f"module {name} has no attribute {attr!r} in the sandbox")
    return __getattr__


def make_namespace(name: str, members: dict[str, Any]) -> Any:
    """A read-only, attribute-only stand-in for module ``name``.

    The result is an instance (so it has no ``__name__``, ``__dict__`` or
    ``__module__`` of its own that leads anywhere); functions are stored as
    staticmethods so they are returned unbound.
    """
    body: dict[str, Any] = {"__slots__": (), "__setattr__": _readonly_setattr,
                            "__delattr__": _readonly_delattr,
                            "__getattr__": _missing_attribute(name),
                            "__repr__": lambda self, _n=name: f"<sandbox module {_n!r}>"}
    for key, value in members.items():
        if key.startswith("_"):
            raise ValueError(f"refusing to expose private name {name}.{key}")
        if isinstance(value, types.ModuleType):
            raise ValueError(f"refusing to expose module {name}.{key}")
        body[key] = staticmethod(value) if callable(value) and not isinstance(value, type) else value
    cls = builtins.type(f"sandbox_{name}", (), body)
    return cls()


def _json_dumps(obj, *, indent=None, sort_keys=False, separators=None, ensure_ascii=True,
                default=None, allow_nan=True):
    return _json.dumps(obj, indent=indent, sort_keys=sort_keys, separators=separators,
                       ensure_ascii=ensure_ascii, default=default, allow_nan=allow_nan)


def _json_loads(s, *, parse_float=None, parse_int=None, object_hook=None, object_pairs_hook=None):
    return _json.loads(s, parse_float=parse_float, parse_int=parse_int,
                       object_hook=object_hook, object_pairs_hook=object_pairs_hook)


# The only random generator tool code can reach: a private instance, reseeded
# from os.urandom in every worker (see reseed()) so forked workers differ.
_RNG = _random.Random()


def reseed() -> None:
    _RNG.seed()


def _build_modules() -> dict[str, Any]:
    rng = _RNG
    mods: dict[str, dict[str, Any]] = {
        "json": {"dumps": _json_dumps, "loads": _json_loads, "JSONDecodeError": _json.JSONDecodeError},
        "re": {
            **{n: getattr(_re, n) for n in ("compile", "search", "match", "fullmatch", "findall",
                                             "finditer", "sub", "subn", "split", "escape")},
            **{n: int(getattr(_re, n)) for n in ("IGNORECASE", "I", "MULTILINE", "M", "DOTALL", "S",
                                                  "VERBOSE", "X", "ASCII", "A")},
            "error": _re.error,
        },
        "math": {n: getattr(_math, n) for n in dir(_math)
                 if not n.startswith("_") and (callable(getattr(_math, n)) or isinstance(getattr(_math, n), float))},
        "datetime": {"datetime": _datetime.datetime, "date": _datetime.date, "time": _datetime.time,
                     "timedelta": _datetime.timedelta, "timezone": _datetime.timezone,
                     "MINYEAR": _datetime.MINYEAR, "MAXYEAR": _datetime.MAXYEAR},
        "random": {n: getattr(rng, n) for n in ("random", "randint", "randrange", "choice", "choices",
                                                 "shuffle", "sample", "uniform", "gauss", "triangular",
                                                 "getrandbits", "seed", "randbytes")},
        "hashlib": {n: getattr(_hashlib, n) for n in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512",
                                                       "sha3_256", "sha3_512", "blake2b", "blake2s",
                                                       "new", "pbkdf2_hmac")},
        "base64": {n: getattr(_base64, n) for n in ("b64encode", "b64decode", "urlsafe_b64encode",
                                                     "urlsafe_b64decode", "standard_b64encode",
                                                     "standard_b64decode", "b32encode", "b32decode",
                                                     "b16encode", "b16decode", "b85encode", "b85decode",
                                                     "a85encode", "a85decode")},
        "time": {n: getattr(_time, n) for n in ("time", "time_ns", "monotonic", "perf_counter", "sleep",
                                                 "gmtime", "strftime")},
    }
    return {name: make_namespace(name, members) for name, members in mods.items()}


def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if type(name) is not str:
        raise ImportError("module name must be a str")
    if level != 0:
        raise ImportError("relative imports are not available in the sandbox")
    ns = MODULES.get(name)
    if ns is None:
        raise ImportError(f"module {name} is not available in the sandbox")
    return ns


MODULES: dict[str, Any] = _build_modules()
BUILTINS: dict[str, Any] = _build_builtins()
