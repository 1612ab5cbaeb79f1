"""The files that ship with this install (``prompts_seed/``, ``tools_seed/``), as the keys they define:

    prompts_seed/NAME.md                 -> prompt:NAME     (soul.example.md excepted)
    prompts_seed/config/NAME.json        -> config:NAME
    tools_seed/NAME.py + NAME.json       -> tool:NAME:code, tool:NAME:meta
    tools_seed/providers/NAME.py + .json -> provider:NAME:code, provider:NAME:meta  (with_providers)

Seeding writes them (:mod:`.seed`); the shipped price list is the floor of every price (:mod:`.config`);
shipped code counts as approved under its name in a store that has no approval record for it
(:mod:`.approval`).
"""

from __future__ import annotations

import json
from pathlib import Path

from brainstem.core import keys
from brainstem.core.errors import BrainstemError, ConfigError

EXAMPLE_SOUL = "soul.example.md"


def seed_dirs() -> tuple[Path, Path]:
    """The prompts_seed/ and tools_seed/ that ship with this install."""
    here = Path(__file__).resolve().parent.parent  # the brainstem package
    for base in (here / "_seeds", here.parent):  # wheel install, then source checkout
        prompts, tools = base / "prompts_seed", base / "tools_seed"
        if prompts.is_dir() and tools.is_dir():
            return prompts, tools
    raise BrainstemError(f"seed files not found next to {here}; reinstall brainstem")


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
