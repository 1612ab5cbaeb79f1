"""The sandbox: KV-stored code (tools, LLM adapters, balance checkers) is hostile.

``run(code, entrypoint, args, services=..., limits=...)`` executes it under
RestrictedPython in a fresh worker process forked from a pre-warmed fork
server and locked down before it was needed (rlimits, an empty environment,
no inherited fds, the kernel layers), with a wall-clock kill and a ``ctx``
served from the calling process; ``report()`` says which kernel protections
its workers have here.  See ``restricted``, ``guards`` and ``tool_builtins``
(what tool code may reach), ``worker`` (the child), ``forkserver``,
``kernel`` (the walls behind the interpreter), ``runner``, ``pool``,
``fork_client`` and ``ctx`` (the runtime side), ``isolation_report``,
``egress`` (the fetch policy) and ``fetch`` (the fetch itself).

The names below are imported when first used: the fork server imports this
package too, and every module it holds is memory each fork copies.
"""

import importlib

_EXPORTS = {
    "Services": "ctx", "StopExecution": "ctx",
    "SandboxUnavailable": "fork_client", "server_pid": "fork_client", "shutdown": "fork_client",
    "report": "isolation_report",
    "Limits": "runner", "Outcome": "runner", "run": "runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
