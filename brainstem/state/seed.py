"""Seeding: write the shipped prompts, config and tools into a store.

Files map to keys:

    prompts_seed/NAME.md                 -> prompt:NAME     (soul.example.md excepted)
    prompts_seed/config/NAME.json        -> config:NAME
    tools_seed/NAME.py + NAME.json       -> tool:NAME:code, tool:NAME:meta
    tools_seed/providers/NAME.py + .json -> provider:NAME:code, provider:NAME:meta  (with_providers)

Seeding writes only keys that are absent, so running it twice changes nothing
and never undoes what the agent has since learned; ``force`` rewrites them.
``soul`` is never overwritten: it is set from a file only when absent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from brainstem.core import keys
from brainstem.core.errors import BrainstemError, ConfigError
from brainstem.store.base import Store

EXAMPLE_SOUL = "soul.example.md"


def seed_dirs() -> tuple[Path, Path]:
    """The prompts_seed/ and tools_seed/ that ship with this install."""
    here = Path(__file__).resolve().parent.parent  # the brainstem package
    for base in (here / "_seeds", here.parent):  # wheel install, then source checkout
        prompts, tools = base / "prompts_seed", base / "tools_seed"
        if prompts.is_dir() and tools.is_dir():
            return prompts, tools
    raise BrainstemError(f"seed files not found next to {here}; reinstall brainstem")


def example_soul_path() -> Path:
    return seed_dirs()[0] / EXAMPLE_SOUL


def seed_entries(prompts_dir: Path | None = None, tools_dir: Path | None = None,
                 with_providers: bool = False) -> dict[str, str]:
    """Every key the seed files define, with its text value (JSON checked)."""
    if prompts_dir is None or tools_dir is None:
        prompts_dir, tools_dir = seed_dirs()
    out: dict[str, str] = {}
    for path in sorted(prompts_dir.glob("*.md")):
        if path.name != EXAMPLE_SOUL:
            out[f"prompt:{path.stem}"] = path.read_text()
    for path in sorted((prompts_dir / "config").glob("*.json")):
        out[f"config:{path.stem}"] = _checked_json(path)
    for code in sorted(tools_dir.glob("*.py")):
        meta = code.with_suffix(".json")
        if not meta.exists():
            raise ConfigError(f"tool {code.stem}: {code.name} has no {meta.name} beside it")
        out[keys.tool_code(code.stem)] = code.read_text()
        out[keys.tool_meta(code.stem)] = _checked_json(meta)
    if with_providers:
        for code in sorted((tools_dir / "providers").glob("*.py")):
            out[f"provider:{code.stem}:code"] = code.read_text()
            out[f"provider:{code.stem}:meta"] = _checked_json(code.with_suffix(".json"))
    return out


def _checked_json(path: Path) -> str:
    text = path.read_text()
    try:
        json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"seed file {path} is not valid JSON: {exc}") from None
    return text


@dataclass
class SeedReport:
    written: list[str] = field(default_factory=list)  # set or changed by this seed
    kept: list[str] = field(default_factory=list)  # present and left as they are (no --force)
    unchanged: list[str] = field(default_factory=list)  # --force, but already the shipped value
    soul: str = "absent"  # "set", "kept", "absent"


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
            from brainstem.state.versions import record_write

            record_write(store, key, old, value, source="seed --force")
        report.written.append(key)
    if store.get(keys.SOUL) is not None:
        report.soul = "kept"
    elif soul_text is not None:
        store.put(keys.SOUL, soul_text)
        report.soul = "set"
    return report
