"""The process environment, read in one place.

Operator settings come from the environment and, when ``BRAINSTEM_ENV_FILE``
names one, a dotenv file whose values the real environment overrides. The
full path reads them through :mod:`brainstem.core.settings` (pydantic); this
module is its light half, standard library only, for what must be known
before (or without) loading settings: the sleep path's store and agent, the
default locations on disk, this host's name, and the values of secrets bound
by name. Nothing else in the package reads ``os.environ``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

STORE = "BRAINSTEM_KV"
AGENT = "BRAINSTEM_KV_PREFIX"
ENV_FILE = "BRAINSTEM_ENV_FILE"
HOSTNAME = "BRAINSTEM_HOSTNAME"
SANDBOX_ISOLATION = "BRAINSTEM_SANDBOX_ISOLATION"


def env_file() -> str | None:
    """The dotenv file ``BRAINSTEM_ENV_FILE`` names, or None."""
    return os.environ.get(ENV_FILE) or None


def file_values() -> dict[str, str]:
    """The env file's variables (none when no file is named or it cannot be read)."""
    path = env_file()
    if not path or not os.path.isfile(path):
        return {}
    from dotenv import dotenv_values  # noqa: PLC0415 -- the sleep path: only the full path reads a file

    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def variables() -> Mapping[str, str]:
    """Every variable the runtime is given: the env file's, overridden by the real environment's."""
    return {**file_values(), **os.environ}


def inherited() -> dict[str, str]:
    """A copy of the real environment, for a process the runtime starts (which reads the env file itself)."""
    return dict(os.environ)


def raw(name: str) -> str | None:
    """One variable of the real environment (the light path: no env file)."""
    return os.environ.get(name)


def store_url() -> str | None:
    """``BRAINSTEM_KV`` when set."""
    return (os.environ.get(STORE) or "").strip() or None


def agent_name() -> str | None:
    """``BRAINSTEM_KV_PREFIX`` as given (None when unset; validated by the store's names)."""
    return os.environ.get(AGENT)


def data_home() -> Path:
    """``XDG_DATA_HOME``, else ``~/.local/share``: where the embedded store lives by default."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share").resolve()


def state_home() -> Path:
    """``XDG_STATE_HOME``, else ``~/.local/state``: local notes that must outlive the store."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")


def default_store_url() -> str:
    """``BRAINSTEM_KV``, or the embedded store in the user's data directory."""
    return store_url() or "sqlite:///" + str(default_store_path())


def default_store_path() -> Path:
    """The embedded store's default file."""
    return data_home() / "brainstem" / "brainstem.db"


def hostname() -> str:
    """This host's name in wake leases: ``BRAINSTEM_HOSTNAME``, else the host name."""
    return (os.environ.get(HOSTNAME) or "").strip() or socket.gethostname()
