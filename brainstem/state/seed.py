"""Seeding: write the shipped prompts, config and tools (:mod:`.shipped`) into a store.

Seeding writes only keys that are absent, so running it twice changes nothing
and never undoes what the agent has since learned; ``force`` rewrites them.
``soul`` is never overwritten: it is set from a file only when absent. Code
that holds the shipped bytes once seeding is done is recorded as approved
(:mod:`brainstem.state.approval`); code kept with other bytes is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from brainstem.core import keys
from brainstem.core.errors import ConfigError
from brainstem.state import approval
from brainstem.state.shipped import EXAMPLE_SOUL, seed_dirs, seed_entries
from brainstem.state.versions import record_write
from brainstem.store.base import Store


def example_soul_path() -> Path:
    return seed_dirs()[0] / EXAMPLE_SOUL


@dataclass
class SeedReport:
    written: list[str] = field(default_factory=list)  # set or changed by this seed
    kept: list[str] = field(default_factory=list)  # present and left as they are (no --force)
    unchanged: list[str] = field(default_factory=list)  # --force, but already the shipped value
    soul: str = "absent"  # "set", "kept", "absent"


def _approve_shipped_code(store: Store, entries: dict[str, str]) -> None:
    """Seeded code is the operator's: every code key now holding its shipped bytes is approved as such."""
    for key, value in entries.items():
        name = keys.code_name(key)
        if name is not None and store.get(key) == value:
            approval.approve(store, name, value, by="seed")


def read_soul_file(path: Path) -> str:
    """The soul's text from ``path``; a file that cannot be read or is empty is a one-line ConfigError."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read soul file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"soul file {path} is not UTF-8 text") from None
    if not text.strip():
        raise ConfigError(f"soul file {path} is empty")
    return text


def seed(store: Store, soul_file: Path | None = None, force: bool = False,
         with_providers: bool = False) -> SeedReport:
    """Write what is absent (everything with ``force``). The soul file, when given, is read and
    checked before anything is written, so a wrong path changes nothing."""
    soul_text = read_soul_file(soul_file) if soul_file is not None else None
    entries = seed_entries(with_providers=with_providers)
    if store.agent is not None:
        # Seeding is what makes a named agent exist: the one command (with `agents register`) that
        # registers its name. Refused, before anything is written, when the default agent holds keys there.
        store.register_agent(store.agent)
    report = SeedReport()
    for key, value in entries.items():
        old = store.get(key)
        if old is not None and not force:
            report.kept.append(key)
            continue
        if old == value:
            report.unchanged.append(key)
            continue
        store.put(key, value)
        if old is not None:
            record_write(store, key, old, value, source="seed --force")
        report.written.append(key)
    _approve_shipped_code(store, entries)
    if store.get(keys.SOUL) is not None:
        report.soul = "kept"
    elif soul_text is not None:
        store.put(keys.SOUL, soul_text)
        report.soul = "set"
    return report
