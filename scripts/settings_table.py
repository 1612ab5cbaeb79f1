"""Regenerate the settings table in docs/configuration.md from the settings model.

    python scripts/settings_table.py          # rewrite the table in place
    python scripts/settings_table.py --check  # exit 1 if the page is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brainstem.core.settings import settings_reference  # noqa: E402

START, END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"


def table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, default, meaning in settings_reference():
        if name == "BRAINSTEM_KV":
            default = "sqlite:///~/.local/share/brainstem/brainstem.db"
        rows.append(f"| `{name}` | {'`' + default + '`' if default else ''} | {meaning} |")
    return "\n".join(rows)


def main() -> int:
    readme = REPO / "docs" / "configuration.md"
    text = readme.read_text()
    a, b = text.index(START) + len(START), text.index(END)
    new = text[:a] + "\n" + table() + "\n" + text[b:]
    if "--check" in sys.argv:
        return 0 if new == text else 1
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
