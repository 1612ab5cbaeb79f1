"""The package's layers, checked on its own imports (those inside functions too).

Each subpackage of ``brainstem`` is a layer, and data flows one way: a module
may import its own package and the layers below it, never one above it or a
peer at the same height. This is the module map the README describes; the
test keeps the code and the map the same, and keeps import circles out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import brainstem

PACKAGE = Path(__file__).resolve().parent.parent / "brainstem"

LAYERS = {name: height for name, height, _ in brainstem.LAYERS}
ENTRY = {"brainstem", "brainstem.__main__"}  # the entry point may import anything


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str, path: Path) -> set[str]:
    """The brainstem modules ``name`` imports, anywhere in its body."""
    out = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "brainstem":
                resolved = _resolve(target)
                if resolved and resolved not in (name, "brainstem") and not name.startswith(resolved + "."):
                    out.add(resolved)
    return out


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_layer():
    loose = [name for name in MODULES if name not in ENTRY and layer(name) is None]
    assert not loose, f"modules outside every layer package: {loose}"


def test_imports_run_down_the_layers_only():
    wrong = []
    for name, targets in GRAPH.items():
        if name in ENTRY:
            continue
        mine = layer(name)
        for target in sorted(targets):
            theirs = layer(target)
            if theirs != mine and (theirs is None or LAYERS[theirs] >= LAYERS[mine]):
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports that run up (or across) the layers:\n" + "\n".join(wrong)


def test_no_import_circles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.count(".") == 1 and n not in ENTRY
                                        and MODULES[n].name == "__init__.py"))
def test_each_layer_says_what_it_holds(name):
    """Each layer's ``__init__`` is a short statement of what the layer is for and what it offers."""
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text()))
    assert doc and len(doc.split()) >= 8, f"{name}/__init__.py needs a docstring naming its public surface"


def test_the_readme_module_map_is_the_tree():
    """The module map (docs/development.md) is generated from the tree; a module added or moved without regenerating it
    (``python scripts/module_map.py --write``) fails here."""
    import importlib.util

    path = PACKAGE.parent / "scripts" / "module_map.py"
    spec = importlib.util.spec_from_file_location("module_map", path)
    module_map = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module_map)
    readme = (PACKAGE.parent / "docs" / "development.md").read_text()
    start = readme.index(module_map.BEGIN) + len(module_map.BEGIN)
    assert readme[start:readme.index(module_map.END)].strip() == module_map.render()
