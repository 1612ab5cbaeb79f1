"""An import-linter contract whose layers are ``brainstem.LAYERS``, so the order is written down once.

pyproject.toml names this type under ``[tool.importlinter]``; ``lint-imports`` (run from the
repository root, which it puts on the path) builds a ``layers`` contract from the tuple: highest
layer first, layers of one height as independent peers (``store | sandbox``), ``brainstem`` as the
container, and exhaustive, so a subpackage missing from the tuple breaks the contract too. Adding a
layer to the tuple is the only edit a new layer needs.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import InvalidContractOptions

from brainstem import LAYERS

CONTAINER = "brainstem"
UNLAYERED = ("__main__",)  # the entry point may import any layer


def layer_lines(layers: tuple[tuple[str, int, str], ...] = LAYERS) -> list[str]:
    """The contract's ``layers`` option: highest first, peers of one height joined as independent."""
    by_height = sorted(layers, key=lambda row: row[1], reverse=True)
    return [" | ".join(sorted(name for name, _, _ in group))
            for _, group in groupby(by_height, key=lambda row: row[1])]


class BrainstemLayers(LayersContract):
    """A ``layers`` contract filled in from ``brainstem.LAYERS``; pyproject.toml gives only its name."""

    type_name = "brainstem_layers"

    def __init__(self, name: str, session_options: dict[str, Any], contract_options: dict[str, Any]) -> None:
        given = sorted(set(contract_options) & {"layers", "containers", "exhaustive", "exhaustive_ignores"})
        if given:
            raise InvalidContractOptions({key: "comes from brainstem.LAYERS; do not set it here" for key in given})
        options = {**contract_options, "layers": layer_lines(), "containers": [CONTAINER],
                   "exhaustive": "true", "exhaustive_ignores": list(UNLAYERED)}
        super().__init__(name, session_options, options)
