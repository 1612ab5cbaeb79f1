"""The guard functions RestrictedPython's rewritten tool code calls (``_getattr_``, ``_write_`` ...).

RestrictedPython restricts the *language*: it rewrites attribute access, item
access, iteration, writes and augmented assignment into calls of guard
functions; these are ours.  Rules (see tests/hostile/test_escapes.py for the
attacks they answer):

* ``_getattr_`` is ``safer_getattr`` (underscore names, ``format``/
  ``format_map`` on str, ``string.Formatter`` and the frame/traceback/code
  walk names are refused) plus a backstop of our own: an attribute whose value
  is a module, frame, code object, traceback or cell, or one of the dangerous
  builtins (``eval``, ``exec``, ``open``, ``type`` ...), is never handed out,
  whatever its name.
* ``_write_`` is ``full_write_guard``: tool code writes into lists and dicts
  and into instances of classes it defined itself (their metaclass marks them
  ``_guarded_writes``), never into anything the host made.
* ``_getiter_`` is :func:`guarded_iter`, which every iterating builtin we
  offer goes through too (see ``tool_builtins``).
"""

from __future__ import annotations

import builtins
import operator
import types
from typing import Any

from RestrictedPython.Guards import full_write_guard, safer_getattr, safer_getattr_raise

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


def guarded_iter(ob: Any):
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
