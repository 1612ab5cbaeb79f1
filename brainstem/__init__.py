"""Brainstem: a timer-woken runtime for autonomous LLM agents."""
__version__ = "0.1.0"

# The package's layers, lowest first: (package, height, what it holds). A module imports only its own
# layer and lower ones; layers of one height are peers and import neither each other. lint-imports
# holds the code to this, and scripts/module_map.py prints the module map in docs/development.md from it.
LAYERS = (
    ("core", 0, "names, plan, events, errors, clock, settings, secrets and the scrubber: no I/O"),
    ("store", 1, "the key-value store (SQLite, Redis, Redis Cluster), karma, the wake lease"),
    ("sandbox", 1, "isolated worker processes that run agent-written code"),
    ("state", 2, "the agent as the store holds it, and the guarded view it writes through"),
    ("llm", 3, "providers, prices, the wire meter and the one chokepoint of every LLM call"),
    ("tools", 4, "agent-written tools and adapters, run in the sandbox with what they are granted"),
    ("session", 5, "one wake, from lease to sleep; replay"),
    ("daemon", 6, "the long-running process that starts wakes: the scheduler and the Telegram poller"),
    ("operator", 7, "the command line, dashboard, metrics and status"),
)
