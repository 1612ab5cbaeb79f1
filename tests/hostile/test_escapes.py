"""Known sandbox-escape techniques, each a real attempt that must fail.

Before the suite: an env var canary is set in this (runtime) process and the
fork server is restarted so that it starts *after* the canary exists; a
canary file is written; the fake services hold ``secret:canary`` and
``other_agent:key`` in their KV (answered if ever asked) and a private
``_token``.  Each case asserts that the attempt failed (``ok`` is False, or
the tool's own report says nothing was reached), that no canary appears
anywhere in the outcome, that services were never asked for anything the
tool was not granted, and that the runtime still runs a trivial tool.

Sources for the techniques: RestrictedPython advisories (CVE-2023-37271
generator/frame walks, CVE-2023-41039 str.format, CVE-2024-47532
AttributeError.obj + string, CVE-2025-22153 except*, CVE-2026-55830
positional-only guard shadowing, CVE-2026-76825 string.Formatter), the
RestrictedPython "security considerations" page (operator.attrgetter,
importable modules), and the usual pyjail/simpleeval/smolagents tricks.
"""

from __future__ import annotations

import json
import os

import pytest

from brainstem.sandbox import Limits, run, shutdown
from tests.helpers import (
    CANARIES,
    CANARY_ENV,
    CANARY_ENV_NAME,
    CANARY_KV_OTHER,
    CANARY_KV_SECRET,
    FakeServices,
    assert_runtime_healthy,
    tool,
)

LIMITS = Limits(timeout_ms=5000, memory_mb=512)

# (id, tool source, kv_access). Each source defines execute(args, ctx); args[0] is
# {"file": <canary path>, "env": <canary env name>}.
CASES: list[tuple[str, str, str]] = []


def case(name: str, body: str, prelude: str = "", kv: str = "none") -> None:
    CASES.append((name, tool(body, prelude), kv))


def raw(name: str, source: str, kv: str = "none") -> None:
    CASES.append((name, source, kv))


# ---- frames, generators, tracebacks (CVE-2023-37271 and friends)
case("gen_gi_frame_attr", """
    g = (x for x in [1])
    return str(g.gi_frame.f_back.f_globals)
""")
case("gen_gi_frame_getattr", """
    g = (x for x in [1])
    return str(getattr(getattr(g, "gi_frame"), "f_globals"))
""")
case("gen_gi_code_getattr", """
    def gen():
        yield 1
    return str(getattr(gen(), "gi_code"))
""")
case("gen_frame_f_back_walk_after_next", """
    def gen():
        yield 1
    g = gen()
    next(g)
    f = getattr(g, "gi_frame")
    while f is not None:
        f = getattr(f, "f_back")
    return "walked"
""")
case("gen_gi_yieldfrom", """
    def inner():
        yield 1
    def outer():
        yield from inner()
    g = outer()
    next(g)
    return str(getattr(g, "gi_yieldfrom"))
""")
case("traceback_dunder_attr", """
    try:
        1 / 0
    except Exception as e:
        tb = e.__traceback__
        return str(tb.tb_frame.f_globals)
""")
case("traceback_via_getattr", """
    try:
        1 / 0
    except Exception as e:
        tb = getattr(e, "__traceback__")
        return str(getattr(getattr(tb, "tb_frame"), "f_back"))
""")
case("traceback_of_ctx_error_tb_next", """
    try:
        ctx.kv.get("secret:canary")
    except Exception as e:
        tb = getattr(e, "__traceback__")
        return str(getattr(tb, "tb_next"))
""")
case("exception_context_chain", """
    try:
        try:
            1 / 0
        except Exception:
            raise ValueError("x")
    except ValueError as e:
        return str(getattr(e, "__context__"))
""")
case("coroutine_cr_frame", """
    async def co():
        return 1
    return str(co().cr_frame)
""")

# ---- str.format / string.Formatter (CVE-2023-41039, CVE-2026-76825)
case("str_format_attribute", """
    return "{0.__class__.__mro__}".format(ctx)
""")
case("str_format_map", """
    return "{x.fetch.__globals__}".format_map({"x": ctx})
""")
case("str_format_via_class", """
    return str.format("{0.__class__}", ctx)
""")
case("str_format_via_getattr", """
    return getattr("{0.__class__}", "format")(ctx)
""")
case("string_formatter_import", """
    import string
    return string.Formatter().get_field("0.__class__", [ctx], {})
""")
case("fstring_dunder", """
    return f"{ctx.__class__}"
""")
case("fstring_nested_spec_dunder", """
    return f"{ctx!r:{ctx.__class__}}"
""")

# ---- AttributeError.obj / .name (CVE-2024-47532)
case("attributeerror_obj_on_module", """
    import json
    try:
        json.no_such_thing
    except AttributeError as e:
        hidden = e.obj
        return str(getattr(hidden, "__dict__"))
""")
case("attributeerror_obj_on_ctx", """
    try:
        ctx.no_such_thing
    except AttributeError as e:
        return [e.name, str(getattr(e.obj, "__class__"))]
""")

# ---- getattr with crafted names (simpleeval/smolagents style)
case("getattr_str_subclass_name", """
    class Name(str):
        pass
    return str(getattr(ctx, Name("__class__")))
""")
case("getattr_str_subclass_startswith", """
    class Sneaky(str):
        def startswith(self, prefix):
            return False
    return str(getattr(ctx.fetch, Sneaky("__globals__")))
""")
case("getattr_str_subclass_eq", """
    class Liar(str):
        def __eq__(self, other):
            return False
    return str(getattr(ctx, Liar("_x")))
""")
case("getattr_join_built_dunder", """
    name = "".join(["_", "_", "cla", "ss", "_", "_"])
    return str(getattr(getattr((), name), "__bases__"))
""")
case("getattr_chr_built_dunder", """
    u = chr(95) * 2
    return str(getattr(1, u + "class" + u))
""")
case("getattr_computed_subclasses_chain", """
    c = getattr((), "__cla" + "ss__")
    b = getattr(c, "__ba" + "se__")
    return [str(x) for x in getattr(b, "__subcl" + "asses__")()]
""")
case("getattr_globals_of_tool_function", """
    def f():
        return 1
    return str(getattr(f, "__globals__"))
""")
case("getattr_builtins_of_function", """
    import json
    return str(getattr(json.dumps, "__builtins__"))
""")
case("map_calls_getattr_with_dunder", """
    return [str(x) for x in map(getattr, [ctx], ["__class__"])]
""")
case("hasattr_probe_then_use", """
    if hasattr(ctx, "__class__"):
        return "leak"
    return str(getattr(ctx, "__class__"))
""")

# ---- guard-name shadowing (CVE-2026-55830) and other compile-time refusals
raw("posonly_shadows_getattr", """
def inner(_getattr_, /):
    return ctx_holder[0].__class__

def execute(args, ctx):
    return str(inner(lambda o, n: getattr(o, n)))
""")
raw("default_arg_shadows_getiter", """
def execute(args, ctx, _getiter_=list):
    return 1
""")
raw("lambda_shadows_write", """
def execute(args, ctx):
    f = lambda _write_: _write_
    return str(f(1))
""")
raw("kwonly_shadows_print", """
def execute(args, ctx, *, _print_=None):
    return 1
""")
raw("global_assign_guard_name", """
_getattr_ = getattr
def execute(args, ctx):
    return str(ctx.__class__)
""")
raw("except_star_exceptiongroup", """
def execute(args, ctx):
    try:
        raise ExceptionGroup("g", [ValueError("x")])
    except* ValueError as eg:
        return str(eg)
""")
case("exceptiongroup_name", """
    return str(ExceptionGroup("g", [ValueError("x")]))
""")
raw("decorator_returns_globals", """
def deco(f):
    return f.__globals__

@deco
def g():
    pass

def execute(args, ctx):
    return str(g)
""")
raw("decorator_getattr_code", """
def deco(f):
    return getattr(f, "__code__")

@deco
def g():
    pass

def execute(args, ctx):
    return str(g)
""")
case("lambda_default_capture", """
    import json
    f = lambda fn=json.dumps: getattr(fn, "__globals__")
    return str(f())
""")
raw("class_init_subclass", """
class Base:
    def __init_subclass__(cls):
        pass

def execute(args, ctx):
    return 1
""")
raw("class_metaclass_keyword", """
class Meta:
    pass

class C(metaclass=Meta):
    pass

def execute(args, ctx):
    return 1
""")
raw("class_getattribute_override", """
class C:
    def __getattribute__(self, name):
        return 1

def execute(args, ctx):
    return 1
""")
case("class_mro_to_object_subclasses", """
    class C:
        pass
    obj = C.mro()[-1]
    return [str(s) for s in getattr(obj, "__subclasses__")()]
""")
case("str_mro_object_reduce_ex", """
    o = str.mro()[-1]
    return str(getattr(o, "__reduce_ex__")(2))
""")
raw("match_class_pattern_dunder", """
def execute(args, ctx):
    match ctx:
        case object(__class__=c):
            return str(c)
""")

# ---- builtins that must not exist
case("builtins_name", """
    return str(__builtins__)
""")
case("type_subclasses", """
    return str(type.__subclasses__(type))
""")
case("type_of_x", """
    return str(type(ctx))
""")
case("tuple_class_bases_subclasses", """
    return str(().__class__.__bases__[0].__subclasses__())
""")
case("object_reduce_ex", """
    return str(object.__reduce_ex__(ctx, 2))
""")
case("reduce_via_getattr", """
    return str(getattr(ctx, "__reduce__")())
""")
case("vars_builtin", "return str(vars(ctx))")
case("globals_builtin", "return str(globals())")
case("locals_builtin", "return str(locals())")
case("dir_builtin", "return str(dir(ctx))")
case("breakpoint_builtin", "breakpoint()\nreturn 1")
case("help_builtin", "return str(help(ctx))")
case("exit_builtin", "exit(0)")
case("quit_builtin", "quit()")
case("open_canary_file", "return open(args['file']).read()")
case("eval_call", "return eval('1+1')")
case("exec_call", "exec('x = 1')\nreturn 1")
case("compile_builtin", "return str(compile('1', 'x', 'eval'))")
case("dunder_import_call", "return str(__import__('os').environ)")
case("getattr_import_from_builtins_mod", """
    import json
    return str(getattr(json, "__import__"))
""")
case("super_builtin", "return str(super())")
case("memoryview_builtin", "return str(memoryview(b'abc'))")
case("bytearray_builtin", "return str(bytearray(b'abc'))")
case("bytes_of_ctx", "return str(bytes(ctx))")
case("id_builtin", "return id(ctx)")
case("format_builtin", "return format(ctx, '')")
case("object_attribute_write", """
    o = object()
    o.x = 1
    return 1
""")
case("builtin_exception_attr_write", """
    e = ValueError("x")
    e.payload = ctx
    return 1
""")

# ---- imports
case("import_os", "import os\nreturn os.environ.get(args['env'])")
case("import_sys", "import sys\nreturn str(sys.modules)")
case("import_builtins", "import builtins\nreturn str(builtins.open)")
case("import_importlib", "import importlib\nreturn str(importlib.import_module('os'))")
case("import_ctypes", "import ctypes\nreturn str(ctypes.CDLL(None))")
case("import_subprocess", "import subprocess\nreturn subprocess.check_output(['id']).decode()")
case("import_socket", "import socket\nreturn str(socket.socket())")
case("import_uuid_os", "import uuid\nreturn str(uuid.os.environ)")
case("import_operator_attrgetter", """
    import operator
    return str(operator.attrgetter("__globals__")(ctx.fetch))
""")
case("import_functools_partial", "import functools\nreturn str(functools.partial)")
case("import_pickle", "import pickle\nreturn str(pickle.loads)")
case("import_gc_referrers", "import gc\nreturn str(gc.get_referrers(ctx))")
case("import_inspect", "import inspect\nreturn str(inspect.currentframe())")
case("import_submodule", "import json.decoder\nreturn str(json.decoder)")
case("import_os_path", "import os.path\nreturn 1")
case("from_json_import_codecs", "from json import codecs\nreturn str(codecs.sys)")
case("from_json_import_decoder_sysmodules_fallback", "from json import decoder\nreturn str(decoder)")
raw("from_import_star", "from json import *\ndef execute(args, ctx):\n    return 1\n")
raw("relative_import", "from . import secrets\ndef execute(args, ctx):\n    return 1\n")
case("json_codecs_sys", "import json\nreturn str(json.codecs.sys.modules)")
case("re_enum_bltns", "import re\nreturn str(re.enum.bltns)")
case("datetime_sys", "import datetime\nreturn str(datetime.sys.modules)")
case("random_inst_attr", "import random\nreturn str(random._inst)")
case("random_bound_self", "import random\nreturn str(getattr(random.randint, '__self__'))")
case("hashlib_sha256_self_module", "import hashlib\nreturn str(getattr(hashlib.sha256, '__self__'))")
case("hashlib_new_globals", "import hashlib\nreturn str(getattr(hashlib.new, '__globals__')['sys'])")
case("datetime_class_module_walk", """
    import datetime
    cls = datetime.datetime
    return str(getattr(cls, "__module__"))
""")
case("re_flag_enum_walk", """
    import re
    flag = re.I
    return str(getattr(flag, "__class__"))
""")
case("json_error_class_mro_walk", """
    import json
    base = json.JSONDecodeError.mro()[-1]
    return str(getattr(base, "__subclasses__")())
""")
case("sys_modules_via_function_globals", """
    import json
    return str(getattr(json.loads, "__globals__")["sys"].modules)
""")

# ---- ctx internals
case("ctx_class", "return str(ctx.__class__)")
case("ctx_class_getattr", "return str(getattr(ctx, '__class__'))")
case("ctx_fetch_closure", "return str(getattr(ctx.fetch, '__closure__'))")
case("ctx_fetch_self", "return str(getattr(ctx.fetch, '__self__'))")
case("ctx_fetch_func_globals", "return str(getattr(getattr(ctx.fetch, '__func__'), '__globals__'))")
case("ctx_dict", "return str(getattr(ctx, '__dict__'))")
case("ctx_kv_dict", "return str(getattr(ctx.kv, '__dict__'))", kv="own")
case("ctx_kv_method_self", "return str(getattr(ctx.kv.get, '__self__'))", kv="own")
case("ctx_kv_other_agents_key_via_walk", """
    k = ctx.kv
    return str(getattr(getattr(k.get, '__func__'), '__closure__'))
""", kv="own")
case("ctx_secrets_private_mapping", "return str(ctx.secrets._mapping)")
case("ctx_secrets_mapping_getattr", "return str(getattr(ctx.secrets, '_mapping'))")
case("ctx_secrets_mutation", "ctx.secrets['GRANTED'] = 'changed'\nreturn ctx.secrets['GRANTED']")
case("ctx_secrets_setitem_dunder", "getattr(ctx.secrets, '__setitem__')('x', 'y')\nreturn 1")
case("ctx_log_overwrite", "ctx.log = None\nreturn 1")
case("ctx_kv_overwrite", "ctx.kv = {}\nreturn 1")
case("ctx_fetch_delete", "del ctx.fetch\nreturn 1")
case("setattr_on_ctx", "setattr(ctx, 'fetch', None)\nreturn 1")
case("ctx_kv_without_grant", "return ctx.kv.get('secret:canary')")

# ---- writes into host objects
case("module_attr_overwrite", "import json\njson.dumps = lambda *a, **k: 'pwned'\nreturn json.dumps(1)")
case("setattr_module", "import json\nsetattr(json, 'loads', None)\nreturn 1")
case("delattr_module", "import math\ndelattr(math, 'sqrt')\nreturn 1")
case("class_attr_overwrite_builtin_type", "str.upper = None\nreturn 1")
case("setattr_dunder_on_own_class", """
    class Mine:
        pass
    setattr(Mine, "__getattribute__", lambda self, name: name)
    return str(Mine())
""")
case("setattr_class_swap_on_own_object", """
    class Mine:
        pass
    m = Mine()
    setattr(m, "__class__", ValueError)
    return str(m)
""")
case("datetime_class_attr_write", "import datetime\ndatetime.datetime.now = None\nreturn 1")

# ---- names and identifiers
case("unicode_normalised_dunder", "return str(ctx.__\uff43\uff4c\uff41\uff53\uff53__)")  # fullwidth "class"
case("private_print_collector", "print(1)\nreturn str(_print)")
case("printed_then_getattr", """
    print("x")
    return str(getattr(printed, "__class__"))
""")

# ---- CPython crashes reachable from plain code: must kill only the worker
case("hash_of_deep_tuple", """
    t = ()
    for i in range(1000000):
        t = (t,)
    return hash(t)
""")
case("chained_generators", """
    g = iter([1])
    for i in range(100000):
        g = (x for x in g)
    return next(g)
""")
case("repr_of_deep_list", """
    x = []
    for i in range(1000000):
        x = [x]
    return repr(x)
""")
case("deep_json_dumps", """
    import json
    x = []
    for i in range(200000):
        x = [x]
    return json.dumps(x)
""")
case("raise_systemexit_out", "raise SystemExit(0)")
case("raise_base_exception_out", """
    class Out(BaseException):
        pass
    raise Out("escape")
""")
case("fork_bomb_attempt", "import os\nwhile True:\n    os.fork()")


IDS = [c[0] for c in CASES]
assert len(IDS) == len(set(IDS)), "duplicate escape case ids"


@pytest.fixture(scope="module")
def escape_env(canaries):
    # Restart the fork server now that the canary is in our environment: a
    # worker must still never see it.
    shutdown()
    assert os.environ[CANARY_ENV_NAME] == CANARY_ENV
    yield canaries
    shutdown()


def _services(kv_access: str) -> FakeServices:
    return FakeServices(
        kv_access=kv_access,
        secrets={"GRANTED": "granted-value"},
        kv={"secret:canary": CANARY_KV_SECRET, "other_agent:key": CANARY_KV_OTHER,
            "mine": "own-value"},
    )


def test_more_than_130_distinct_techniques():
    assert len(CASES) > 130


@pytest.mark.parametrize("name, source, kv_access", CASES, ids=IDS)
def test_escape_fails(escape_env, name, source, kv_access):
    services = _services(kv_access)
    outcome = run(source, "execute", [{"file": escape_env["file"], "env": CANARY_ENV_NAME}],
                  services=services, limits=LIMITS)
    blob = json.dumps([outcome.ok, outcome.value, outcome.error, outcome.output], default=str)
    for canary in CANARIES:
        assert canary not in blob, f"{name}: canary leaked: {blob[:300]}"
    # The escape failed: the tool did not complete.
    assert not outcome.ok, f"{name}: attempt completed: {outcome.value!r}"
    assert outcome.error and "\n" not in outcome.error
    # Nothing the tool was not granted was asked of services.
    if kv_access == "none":
        assert not [c for c in services.calls if c[0].startswith("kv_")], services.calls
    assert all(c[1] not in ("secret:canary", "other_agent:key") for c in services.calls)
    assert services.secrets == {"GRANTED": "granted-value"}
    assert services.kv["mine"] == "own-value"


def test_runtime_survived_the_suite(escape_env):
    assert_runtime_healthy()
    assert os.environ[CANARY_ENV_NAME] == CANARY_ENV

