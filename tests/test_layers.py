"""Imports point down the layers: cli -> bench / reproduce -> tasks -> train -> analysis -> translate -> decoding ->
interop -> models -> corpora -> connections / data / tokenization -> the shared base (config, run_dir, device,
distributed, compiled) -> host (the machine), as LAYERS numbers them. A relative import of a layer not strictly
below the importer's fails here (within a sub-package imports are free)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "skiplab"
LAYERS = {"cli": 6, "__main__": 7, "bench": 5.5, "reproduce": 5.5, "tasks": 5.2, "train": 5, "translate": 4, "decoding": 3.8, "analysis": 4.5, "interop": 3.5, "models": 3, "connections": 2,
          "data": 2, "tokenization": 2, "corpora": 2.5, "config": 1, "run_dir": 1, "device": 1,
          "distributed": 1, "compiled": 1, "host": 0.5, "__init__": 7}


def layer_of(parts: tuple[str, ...]) -> str:
    return parts[0].removesuffix(".py")


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def imported(path: Path) -> list[tuple[str, int]]:
    """(top-level skiplab sub-package, line) of every relative import in ``path``."""
    rel = path.relative_to(PACKAGE).parts
    here = list(rel[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            target = base + (node.module.split(".") if node.module else [])
            names = [target] if node.module or base else [[a.name] for a in node.names]
            for t in names:
                if t:
                    out.append((t[0], node.lineno))
    return out


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = layer_of(path.relative_to(PACKAGE).parts)
    for target, line in imported(path):
        if target != own:
            assert LAYERS[target] < LAYERS[own], f"{path.name}:{line} imports {target} from {own} (upward)"
