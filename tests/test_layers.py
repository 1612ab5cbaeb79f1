"""The package's shape: its layers, its module map, and how big a module or function may grow.

Each subpackage of ``brainstem`` is a layer (``brainstem.LAYERS``), and data flows one way: a module
may import its own package and the layers below it, never one above it or a peer at the same height.
import-linter checks this (``lint-imports``, configured in pyproject.toml from
``scripts/layers_contract.py``); the tests here run it, so ``python -m pytest`` alone checks it too.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

import brainstem
from scripts.layers_contract import BrainstemLayers, layer_lines

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "brainstem"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=sysconfig.get_path("scripts")) or shutil.which("lint-imports")
    assert exe, "lint-imports is missing: install the test extras (pip install -e '.[test]')"
    return subprocess.run([exe, "--no-cache", "--no-logo"], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    """Imports run down the layers (those inside functions too), and no package's modules import in a circle."""
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_the_layers_contract_is_brainstem_LAYERS():
    """The contract import-linter checks is the tuple itself: every layer, highest first, one height per line."""
    height = {name: h for name, h, _ in brainstem.LAYERS}
    rows = [sorted(tail.name for tail in layer.module_tails) for layer in BrainstemLayers("layers", {}, {}).layers]
    assert sorted(name for row in rows for name in row) == sorted(height)
    heights = [{height[name] for name in row} for row in rows]
    assert all(len(h) == 1 for h in heights)
    assert [h.pop() for h in heights] == sorted(set(height.values()), reverse=True)


def test_a_new_layer_needs_only_its_entry():
    layers = (("core", 0, ""), ("store", 1, ""), ("sandbox", 1, ""), ("session", 2, ""), ("daemon", 3, ""))
    assert layer_lines(layers) == ["daemon", "session", "sandbox | store", "core"]


def test_the_contract_breaks_on_an_import_up_across_or_outside_the_layers(tmp_path):
    """A throwaway package with the same configuration: an upward import hidden in a function, a peer importing
    its peer, and a subpackage missing from LAYERS are each reported."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "layers_contract.py", tmp_path / "scripts")
    files = {
        "__init__.py": 'LAYERS = (("core", 0, ""), ("store", 1, ""), ("sandbox", 1, ""), ("session", 2, ""))\n',
        "core/__init__.py": "", "store/__init__.py": "", "sandbox/__init__.py": "", "session/__init__.py": "",
        "stray/__init__.py": "",
        "core/clock.py": "def now():\n    from brainstem.session import wake\n    return wake\n",
        "store/karma.py": "from brainstem.sandbox import pool\n",
        "sandbox/pool.py": "from brainstem.core import clock\n",
        "session/wake.py": "from brainstem.store import karma\n",
    }
    for name, text in files.items():
        path = tmp_path / "brainstem" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    run = lint_imports(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    for broken in ("brainstem.core.clock -> brainstem.session.wake", "brainstem.store.karma -> brainstem.sandbox.pool",
                   "- brainstem.stray"):
        assert broken in run.stdout, run.stdout


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("layer", [name for name, _, _ in brainstem.LAYERS])
def test_each_layer_says_what_it_holds(layer):
    """Each layer's ``__init__`` is a short statement of what the layer is for and what it offers."""
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
    assert doc and len(doc.split()) >= 8, f"{layer}/__init__.py needs a docstring naming its public surface"


def test_no_module_over_500_lines():
    long = [f"{path.relative_to(ROOT)}: {n}" for path in modules()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by idea):\n" + "\n".join(long)


def test_no_function_over_80_lines():
    long = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n}")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_readme_module_map_is_the_tree():
    """The module map (docs/development.md) is generated from the tree; a module added or moved without regenerating it
    (``python scripts/module_map.py --write``) fails here."""
    import importlib.util

    path = ROOT / "scripts" / "module_map.py"
    spec = importlib.util.spec_from_file_location("module_map", path)
    module_map = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_map)
    readme = (ROOT / "docs" / "development.md").read_text()
    start = readme.index(module_map.BEGIN) + len(module_map.BEGIN)
    assert readme[start:readme.index(module_map.END)].strip() == module_map.render()
