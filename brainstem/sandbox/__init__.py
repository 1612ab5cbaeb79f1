"""The sandbox: KV-stored code (tools, LLM adapters, balance checkers) is hostile.

``run(code, entrypoint, args, services=..., limits=...)`` executes it under
RestrictedPython in a fresh worker process forked from a pre-warmed fork
server, with rlimits, an empty environment, no inherited fds, a wall-clock
kill and a ``ctx`` served from the calling process.  See ``policy`` (what tool
code may reach), ``worker`` (the child), ``forkserver``, ``runner`` (the
runtime side), ``egress`` (the fetch policy) and ``sanitize`` (untrusted text
before it reaches a prompt).
"""

from brainstem.sandbox.runner import (
    Limits,
    Outcome,
    SandboxUnavailable,
    Services,
    StopExecution,
    run,
    server_pid,
    shutdown,
)

__all__ = ["Limits", "Outcome", "SandboxUnavailable", "Services", "StopExecution", "run", "server_pid", "shutdown"]
