"""The RestrictedPython policy, in-process: builtins, prepared modules, what attribute walks reach."""

from __future__ import annotations

import builtins
import types

import pytest
import RestrictedPython
from RestrictedPython.Guards import full_write_guard, safer_getattr

from brainstem.sandbox import guards, restricted, tool_builtins, worker


def test_restrictedpython_version():
    major = int(RestrictedPython.__version__.split(".")[0]) if hasattr(RestrictedPython, "__version__") else None
    if major is None:
        from importlib.metadata import version

        major = int(version("RestrictedPython").split(".")[0])
    assert major >= 9


def test_removed_and_forbidden_builtins_absent():
    b = tool_builtins.BUILTINS
    for name in ("id", "SystemExit", "KeyboardInterrupt", "GeneratorExit", "eval", "exec", "compile",
                 "open", "type", "vars", "dir", "globals", "locals", "breakpoint", "help", "exit",
                 "quit", "input", "memoryview", "bytearray", "super", "object", "ExceptionGroup",
                 "_getattr_"):
        assert name not in b, name
    assert b["__import__"] is tool_builtins.guarded_import
    assert b["getattr"] is guards.guarded_getattr
    assert b["setattr"] is guards.guarded_setattr and b["delattr"] is guards.guarded_delattr


def test_useful_builtins_present():
    for name in ("sorted", "min", "max", "sum", "any", "all", "enumerate", "zip", "map", "filter",
                 "reversed", "list", "dict", "set", "frozenset", "tuple", "isinstance", "len",
                 "range", "abs", "round", "str", "int", "float", "bool", "repr", "Exception",
                 "ValueError", "KeyError", "TypeError", "RuntimeError", "BaseException"):
        assert name in tool_builtins.BUILTINS, name


def test_rp9_removed_iterating_builtins_are_wrappers_not_the_real_ones():
    # RestrictedPython 9 dropped these because they iterate in C past _getiter_.
    for name, real in (("sorted", sorted), ("tuple", tuple), ("zip", zip), ("reversed", reversed),
                       ("bytes", bytes)):
        assert tool_builtins.BUILTINS[name] is not real
        assert isinstance(tool_builtins.BUILTINS[name], types.FunctionType)


def test_wrappers_route_through_getiter(monkeypatch):
    seen = []
    real = guards.guarded_iter

    def spy(ob):
        seen.append(type(ob).__name__)
        return real(ob)

    monkeypatch.setattr(tool_builtins, "guarded_iter", spy)  # what the wrappers call
    b = tool_builtins.BUILTINS
    b["sorted"]([2, 1])
    b["tuple"]({1})
    list(b["zip"]([1], "a"))
    b["sum"]((1, 2))
    b["bytes"]([65])
    b["dict"]([("a", 1)])
    assert seen == ["list", "set", "list", "str", "tuple", "list", "list"]


def test_isinstance_understands_wrappers():
    b = tool_builtins.BUILTINS
    assert b["isinstance"]((1,), (b["list"], b["tuple"]))
    assert b["isinstance"]({}, b["dict"]) and not b["isinstance"]([], b["dict"])
    assert b["issubclass"](bool, int)


def test_guards_are_the_required_ones():
    g = restricted.make_globals(restricted.OutputSink(100))
    assert g["_write_"] is full_write_guard
    assert g["_getattr_"] is guards.guarded_getattr
    # our getattr is safer_getattr plus a backstop, never Eval.default_guarded_getattr
    with pytest.raises(AttributeError):
        guards.guarded_getattr(1, "__class__")
    with pytest.raises(NotImplementedError):
        guards.guarded_getattr("{}", "format")
    with pytest.raises(TypeError):
        guards.guarded_getattr(1, type("S", (str,), {})("real"))
    assert safer_getattr(1, "real") == 1


def test_getattr_backstop_refuses_modules_and_frames():
    holder = types.SimpleNamespace(mod=types, fn=builtins.eval, t=builtins.type, ok=1)
    for name in ("mod", "fn", "t"):
        with pytest.raises(AttributeError):
            guards.guarded_getattr(holder, name)
    assert guards.guarded_getattr(holder, "ok") == 1
    assert guards.guarded_getattr(holder, "missing", None) is None


def test_imports_give_namespaces_not_modules():
    for name in tool_builtins.ALLOWED_MODULES:
        ns = tool_builtins.guarded_import(name)
        assert not isinstance(ns, types.ModuleType)
        assert not hasattr(ns, "__name__")
        with pytest.raises(AttributeError):
            ns.anything = 1
    with pytest.raises(ImportError, match="module os is not available in the sandbox"):
        tool_builtins.guarded_import("os")
    with pytest.raises(ImportError):
        tool_builtins.guarded_import("json", level=1)


def _reachable(roots, depth):
    """Every value reachable from roots through non-underscore attribute names,
    using the same getattr tool code gets."""
    seen: dict[int, object] = {}
    frontier = list(roots)
    for _ in range(depth):
        nxt = []
        for obj in frontier:
            if id(obj) in seen:
                continue
            seen[id(obj)] = obj
            try:
                names = [n for n in builtins.dir(obj) if not n.startswith("_")]
            except Exception:  # noqa: BLE001
                continue
            for n in names:
                try:
                    nxt.append(guards.guarded_getattr(obj, n))
                except Exception:  # noqa: BLE001
                    continue
        frontier = nxt
    for obj in frontier:
        seen.setdefault(id(obj), obj)
    return list(seen.values())


def test_nothing_reachable_leads_to_modules_or_the_channel():
    import os
    import sys

    marker = object()

    def call(op, payload):  # stands in for the channel closure
        return marker

    ctx = worker.build_ctx(call, True, {"K": "v"})
    roots = [*tool_builtins.MODULES.values(), *tool_builtins.BUILTINS.values(), ctx]
    reached = _reachable(roots, depth=4)
    assert len(reached) > 200
    forbidden = {id(x) for x in (os, sys, builtins, os.environ, sys.modules, builtins.__dict__,
                                 call, marker, builtins.eval, builtins.exec, builtins.open,
                                 builtins.type, builtins.__import__)}
    for obj in reached:
        assert not isinstance(obj, (types.ModuleType, types.FrameType, types.CodeType,
                                    types.TracebackType, types.CellType)), repr(obj)
        assert id(obj) not in forbidden, repr(obj)


def test_ctx_has_methods_only():
    ctx = worker.build_ctx(lambda op, payload: None, True, {"K": "v"})
    public = {n for n in dir(ctx) if not n.startswith("_")}
    assert public == {"fetch", "log", "kv", "secrets", "send_telegram"}
    assert type(ctx).__slots__ == () and type(ctx.kv).__slots__ == ()
    assert {n for n in dir(ctx.kv) if not n.startswith("_")} == {"get", "put", "list", "delete"}
    assert isinstance(ctx.secrets, types.MappingProxyType)
    assert worker.build_ctx(lambda op, payload: None, False, {}).kv is None


def test_compile_errors_are_one_line():
    with pytest.raises(restricted.CompileError) as e:
        restricted.compile_tool("def f(:\n  pass\n")
    assert str(e.value) == "SyntaxError: line 1: invalid syntax"
    with pytest.raises(restricted.CompileError) as e:
        restricted.compile_tool("x = y._z\n")
    assert str(e.value).startswith("not allowed: line 1:")
