"""Exceptions the runtime raises on purpose.

Each carries a message written for an operator: the CLI prints it as one line
and exits non-zero, with no traceback unless ``--debug`` is given.
"""


def one_line(text: object, limit: int = 500) -> str:
    """``text`` as one line of at most ``limit`` characters: how every message reaches an operator."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class BrainstemError(Exception):
    """Base of every error Brainstem raises deliberately."""

    exit_code = 1


class ConfigError(BrainstemError):
    """The operator's settings are wrong or incomplete."""

    exit_code = 2


class UnknownAgent(ConfigError):
    """A named agent that is not registered in the store: nothing was seeded under that name (a typo,
    often). Only ``brainstem seed`` and ``brainstem agents register`` make an agent exist."""


class BadArgument(BrainstemError):
    """A command-line argument is not in the form the command takes; the message shows the form."""

    exit_code = 2


class NotFound(BadArgument):
    """Something the operator named on the command line (a session, a key) is not in the store;
    the message says how to list what is there."""


class StoreUnavailable(BrainstemError):
    """The store cannot be reached or opened (message names it, never its password)."""

    exit_code = 3


class MalformedValue(BrainstemError):
    """A stored value is not in the form the runtime needs (e.g. not JSON)."""


class KVWriteRefused(BrainstemError):
    """The guarded store view refused an agent write (soul, protected key, bad key)."""


class SoulImmutable(KVWriteRefused):
    """Something tried to change ``soul`` without the operator override."""


class ForeignAgentKey(KVWriteRefused):
    """A key belongs to another agent sharing the store (or to the store's internals): this agent
    cannot write, delete, append to or lock it."""


class LeaseLost(BrainstemError):
    """A session's wake lease is no longer its own (it ran out, or another host holds it now): the
    store refuses the session's writes to the keys that say who ran last (``keys.FENCED``)."""


class LeaseHeld(BrainstemError):
    """Another wake holds the agent's wake lease."""

    exit_code = 75  # EX_TEMPFAIL: try again later


LockHeld = LeaseHeld  # the name it had when the lease was called a lock


class NotText(MalformedValue, ConfigError):
    """A stored value (or its metadata) is not text: bytes that are not valid UTF-8. The message names
    the key; the agent cannot wake on such a soul or prompt, so this is a misconfiguration (exit 2)."""


class StoreReadOnly(StoreUnavailable):
    """The store refuses writes (a file or directory without write permission, a Redis replica)."""


class StoreFull(StoreUnavailable):
    """The store has no room left for a write (its disk is full, or Redis hit maxmemory)."""
