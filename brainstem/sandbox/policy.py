"""The RestrictedPython policy: what tool code can name, reach and import.

RestrictedPython restricts the *language* (it rewrites attribute access,
item access, iteration, writes and ``print`` into calls of guard functions);
this module supplies those guards and the *environment*: the builtins and the
only modules tool code can import.  Everything here is imported by the fork
server before it forks, so a worker pays nothing to set it up.

Rules (see tests/sandbox/test_escapes.py for the attacks they answer):

* ``_getattr_`` is ``safer_getattr`` (underscore names, ``format``/
  ``format_map`` on str, ``string.Formatter`` and the frame/traceback/code
  walk names are refused) plus a backstop of our own: an attribute whose value
  is a module, frame, code object, traceback or cell, or one of the dangerous
  builtins (``eval``, ``exec``, ``open``, ``type`` ...), is never handed out,
  whatever its name.
* ``_write_`` is ``full_write_guard``: tool code writes into lists and dicts
  and into instances of classes it defined itself (their metaclass marks them
  ``_guarded_writes``), never into anything the host made.
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
"""

from __future__ import annotations

import base64 as _base64
import builtins
import datetime as _datetime
import hashlib as _hashlib
import json as _json
import math as _math
import operator
import random as _random
import re as _re
import time as _time
import types
from typing import Any

from RestrictedPython import compile_restricted_exec, safe_builtins
from RestrictedPython.Guards import (
    full_write_guard,
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
    safer_getattr,
    safer_getattr_raise,
)

TOOL_FILENAME = "<tool>"

ALLOWED_MODULES = ("json", "re", "math", "datetime", "random", "hashlib", "base64", "time")

# Builtins safe_builtins offers that we take away.
REMOVED_BUILTINS = frozenset({"id", "SystemExit", "KeyboardInterrupt", "GeneratorExit"})

# Never handed out as the value of an attribute, whatever the attribute's name.
_BLOCKED_VALUE_TYPES = (
    types.ModuleType,
    types.FrameType,
    types.CodeType,
    types.TracebackType,
    types.CellType,
)
_BLOCKED_VALUES_BY_ID = {
    id(v): v
    for v in (
        builtins.eval, builtins.exec, builtins.compile, builtins.open, builtins.__import__,
        builtins.getattr, builtins.setattr, builtins.delattr, builtins.vars, builtins.globals,
        builtins.locals, builtins.dir, builtins.breakpoint, builtins.input, builtins.type,
        builtins.super, builtins.object, builtins.memoryview, builtins.bytearray,
    )
}


_MISSING = object()


def _iter(ob: Any):
    """The ``_getiter_`` guard: iteration is allowed; all iterating builtins go through it."""
    return builtins.iter(ob)


# --------------------------------------------------------------------------- getattr


def guarded_getattr(ob: Any, name: Any, *default: Any) -> Any:
    """``_getattr_`` and the ``getattr`` builtin (raises like the real one when there is no default)."""
    if len(default) > 1:
        raise TypeError("getattr expected at most 3 arguments")
    if default:
        value = safer_getattr(ob, name, default[0])
    else:
        value = safer_getattr_raise(ob, name)
    if isinstance(value, _BLOCKED_VALUE_TYPES) or _BLOCKED_VALUES_BY_ID.get(id(value), _MISSING) is value:
        raise AttributeError(f'"{name}" is not accessible in the sandbox')
    return value


def guarded_hasattr(ob: Any, name: Any) -> bool:
    try:
        guarded_getattr(ob, name)
    except (AttributeError, NotImplementedError, TypeError):
        return False
    return True


def _check_write_name(name: Any) -> None:
    if type(name) is not str:
        raise TypeError("attribute name must be a str")
    if name.startswith("_"):
        raise AttributeError(f'"{name}" is an invalid attribute name because it starts with "_"')


def guarded_setattr(ob: Any, name: Any, value: Any) -> None:
    """``setattr``: full_write_guard, and (unlike RestrictedPython's) no underscore names."""
    _check_write_name(name)
    setattr(full_write_guard(ob), name, value)


def guarded_delattr(ob: Any, name: Any) -> None:
    _check_write_name(name)
    delattr(full_write_guard(ob), name)


def guarded_getitem(ob: Any, index: Any) -> Any:
    return ob[index]


_INPLACE_OPS = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
    "<<=": operator.ilshift, ">>=": operator.irshift, "|=": operator.ior,
    "^=": operator.ixor, "&=": operator.iand, "@=": operator.imatmul,
}


def guarded_inplacevar(op: str, x: Any, y: Any) -> Any:
    fn = _INPLACE_OPS.get(op)
    if fn is None:
        raise SyntaxError(f"augmented assignment {op!r} is not allowed")
    return fn(x, y)


def guarded_apply(func: Any, *args: Any, **kwargs: Any) -> Any:
    """``f(*a, **kw)`` in tool code becomes ``_apply_(f, *a, **kw)``."""
    return func(*args, **kwargs)


def restricted_metaclass(name: str, bases: tuple, namespace: dict) -> type:
    """``__metaclass__`` for ``class`` statements in tool code.

    Marks the class ``_guarded_writes`` so that ``full_write_guard`` lets tool
    code set attributes on its own objects (``self.x = 1``).  Host objects
    never carry the mark, so they stay read-only.
    """
    namespace["_guarded_writes"] = True
    return builtins.type(name, bases, namespace)


# --------------------------------------------------------------------------- print


class OutputSink:
    """Where ``print`` output of one execution goes; calls ``on_overflow`` past the cap."""

    __slots__ = ("parts", "size", "cap", "on_overflow")

    def __init__(self, cap: int, on_overflow=None):
        self.parts: list[str] = []
        self.size = 0
        self.cap = cap
        self.on_overflow = on_overflow

    def write(self, text: str) -> None:
        n = len(text.encode("utf-8", "surrogatepass"))
        if self.size + n > self.cap:
            if self.on_overflow is not None:
                self.on_overflow()
            raise RuntimeError(f"output limit ({self.cap} bytes) exceeded")
        self.size += n
        self.parts.append(text)

    def text(self) -> str:
        return "".join(self.parts)


def make_print_factory(sink: OutputSink):
    """``_print_``: RestrictedPython calls it once per scope that prints."""

    class PrintCollector:
        __slots__ = ("txt",)

        def __init__(self, _getattr_=None):
            self.txt: list[str] = []

        def _call_print(self, *objects, sep=" ", end="\n", file=None, flush=False):
            if sep is None:
                sep = " "
            if end is None:
                end = "\n"
            if type(sep) is not str or type(end) is not str:
                raise TypeError("sep and end must be str")
            text = sep.join(builtins.str(o) for o in objects) + end
            sink.write(text)
            self.txt.append(text)

        def __call__(self) -> str:
            return "".join(self.txt)

    return PrintCollector


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
    return builtins.list(_iter(iterable))


@_stands_for(tuple)
def g_tuple(iterable=(), /):
    return builtins.tuple(_iter(iterable))


@_stands_for(set)
def g_set(iterable=(), /):
    return builtins.set(_iter(iterable))


@_stands_for(frozenset)
def g_frozenset(iterable=(), /):
    return builtins.frozenset(_iter(iterable))


@_stands_for(dict)
def g_dict(*args, **kwargs):
    if len(args) > 1:
        raise TypeError(f"dict expected at most 1 argument, got {len(args)}")
    if not args:
        return builtins.dict(**kwargs)
    src = args[0]
    if builtins.isinstance(src, (dict, types.MappingProxyType)) or guarded_hasattr(src, "keys"):
        pairs = [(k, src[k]) for k in _iter(src.keys())]
    else:
        pairs = _iter(src)
    return builtins.dict(pairs, **kwargs)


@_stands_for(bytes)
def g_bytes(source=b"", encoding=None, errors=None):
    if encoding is not None:
        return builtins.bytes(source, encoding, errors or "strict")
    if builtins.isinstance(source, (int, bytes, str)):
        return builtins.bytes(source)
    return builtins.bytes(builtins.list(_iter(source)))


@_stands_for(enumerate)
def g_enumerate(iterable, start=0):
    return builtins.enumerate(_iter(iterable), start)


@_stands_for(zip)
def g_zip(*iterables, strict=False):
    return builtins.zip(*[_iter(i) for i in iterables], strict=strict)


@_stands_for(map)
def g_map(function, *iterables):
    return builtins.map(function, *[_iter(i) for i in iterables])


@_stands_for(filter)
def g_filter(function, iterable):
    return builtins.filter(function, _iter(iterable))


@_stands_for(reversed)
def g_reversed(seq):
    if builtins.type(seq) in (list, tuple, str, range, bytes):
        return builtins.reversed(seq)
    return builtins.reversed(builtins.list(_iter(seq)))


def g_sorted(iterable, /, *, key=None, reverse=False):
    return builtins.sorted(_iter(iterable), key=key, reverse=reverse)


def _min_max(fn, args, kwargs):
    if len(args) == 1:
        return fn(_iter(args[0]), **kwargs)
    return fn(*args, **kwargs)


def g_min(*args, **kwargs):
    return _min_max(builtins.min, args, kwargs)


def g_max(*args, **kwargs):
    return _min_max(builtins.max, args, kwargs)


def g_sum(iterable, /, start=0):
    return builtins.sum(_iter(iterable), start)


def g_any(iterable):
    return builtins.any(_iter(iterable))


def g_all(iterable):
    return builtins.all(_iter(iterable))


def g_iter(*args):
    if len(args) == 1:
        return _iter(args[0])
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


class CompileError(Exception):
    """Tool source did not compile; the message is one operator-readable line."""


def compile_tool(source: str):
    """Compile tool source under RestrictedPython; raise CompileError with a one-line message."""
    if type(source) is not str:
        raise CompileError("tool code must be a str")
    result = compile_restricted_exec(source, TOOL_FILENAME)
    if result.errors:
        raise CompileError(_format_compile_error(result.errors[0], len(result.errors)))
    return result.code


_SYNTAX_RE = _re.compile(r"^Line (\d+): SyntaxError: (.*?)(?: at statement: .*)?$", _re.S)
_POLICY_RE = _re.compile(r"^Line (\d+): (.*)$", _re.S)


def _format_compile_error(first: str, count: int) -> str:
    more = f" (and {count - 1} more)" if count > 1 else ""
    m = _SYNTAX_RE.match(first)
    if m:
        return f"SyntaxError: line {m.group(1)}: {m.group(2)}{more}"
    m = _POLICY_RE.match(first)
    if m:
        return f"not allowed: line {m.group(1)}: {m.group(2)}{more}"
    return f"not allowed: {first}{more}"


def make_globals(sink: OutputSink) -> dict[str, Any]:
    """A fresh globals dict for one execution."""
    return {
        "__builtins__": BUILTINS,
        "__name__": "tool",
        "__metaclass__": restricted_metaclass,
        "_getattr_": guarded_getattr,
        "_getitem_": guarded_getitem,
        "_getiter_": _iter,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_write_": full_write_guard,
        "_inplacevar_": guarded_inplacevar,
        "_apply_": guarded_apply,
        "_print_": make_print_factory(sink),
    }


def warm_up() -> None:
    """Import lazily-loaded stdlib pieces now (workers cannot open files later)."""
    import encodings.ascii  # noqa: F401
    import encodings.cp1252  # noqa: F401
    import encodings.idna  # noqa: F401
    import encodings.latin_1  # noqa: F401
    import encodings.utf_16  # noqa: F401
    import encodings.utf_32  # noqa: F401
    _datetime.datetime.strptime("2024-01-02 03:04:05", "%Y-%m-%d %H:%M:%S")
    _datetime.datetime.now().astimezone()
    _time.localtime()
    _time.strftime("%c")
    _re.compile(r"(?i)warm[- ]up\d+").findall("Warm-up1")
    _json.loads(_json.dumps({"a": [1, 2.5, None, True, "x"]}))
    for name in ("md5", "sha1", "sha256", "sha512", "sha3_256", "blake2b"):
        getattr(_hashlib, name)(b"x").hexdigest()
    _base64.b64decode(_base64.b64encode(b"x"))
    "x".encode("idna")
    code = compile_tool("def execute(args, ctx):\n    print(1)\n    return [x for x in args]\n")
    glb = make_globals(OutputSink(1 << 16))
    exec(code, glb)
    glb["execute"]([1], None)
