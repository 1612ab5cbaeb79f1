"""The sandbox: KV-stored code (tools, LLM adapters, balance checkers) is hostile.

``run(code, entrypoint, args, services=..., limits=...)`` executes it under
RestrictedPython in a fresh worker process forked from a pre-warmed fork
server, with rlimits, an empty environment, no inherited fds, a wall-clock
kill and a ``ctx`` served from the calling process; ``report()`` says which
kernel protections its workers have here.  See ``policy``, ``guards`` and
``tool_builtins`` (what tool code may reach), ``worker`` (the child),
``forkserver``, ``kernel`` (the walls behind the interpreter), ``runner``,
``fork_client`` and ``ctx`` (the runtime side), ``isolation_report``,
``egress`` (the fetch policy) and ``fetch`` (the fetch itself).
"""

from brainstem.sandbox.ctx import Services, StopExecution
from brainstem.sandbox.fork_client import SandboxUnavailable, server_pid, shutdown
from brainstem.sandbox.isolation_report import report
from brainstem.sandbox.runner import Limits, Outcome, run

__all__ = ["Limits", "Outcome", "SandboxUnavailable", "Services", "StopExecution", "report", "run", "server_pid",
           "shutdown"]
