"""The imports say what docs/architecture.md says: each layer imports only the layers below it, and no cycles.

Layers, lowest first (docs/architecture.md, "Layout"): records → the pure rules → the providers
(configuration validates a residence's `provider:` against their registry) → configuration,
continuation and ledger → generation → context and delivery → the resident's turn → the rooms
(Discord, replay, demo) → the CLI. The local servers stand beside everything and import none of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BOT = Path(__file__).resolve().parent.parent / "residents"

# top-level unit under residents/ → its layer; a module may import its own unit and lower layers only
LAYERS: dict[str, int] = {
    "records": 0,
    "truth": 1,
    "models": 1,
    "text": 1,
    "observe": 1,
    "bundled": 1,
    "config": 3,
    "provider": 2,
    "continuation": 3,
    "ledger": 3,
    "generation": 4,
    "context": 5,
    "delivery": 5,
    "resident": 6,
    "metrics": 6,
    "discord": 7,
    "replay": 7,
    "demo": 8,
    "cli": 9,
    "__main__": 10,
}
BESIDE = "localservers"  # imports nothing of residents outside itself; anything at layer ≥ 7 may use it


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path) -> str:
    rel = path.relative_to(BOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Modules of `residents` this file imports, resolved to absolute names (TYPE_CHECKING blocks included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "residents"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "residents":
                continue
            for a in node.names:  # `from . import truth` imports the module residents.truth, not the package
                candidate = BOT.parent / Path(*f"{target}.{a.name}".split("."))
                if candidate.with_suffix(".py").exists() or candidate.is_dir():
                    found.add(f"{target}.{a.name}")
                else:
                    found.add(target)
    return found - {me}


FILES = sorted(BOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(BOT.parent)))
def test_each_module_imports_only_lower_layers(path: Path) -> None:
    me = module_name(path)
    unit = unit_of(me)
    wrong = []
    for target in sorted(imports_of(path)):
        other = unit_of(target)
        if other in ("", unit):
            continue
        if unit == BESIDE:
            wrong.append(f"{target} (the local servers import nothing of the pipeline)")
        elif other == BESIDE:
            if LAYERS[unit] < LAYERS["discord"]:
                wrong.append(f"{target} (only rooms and the CLI may embed the local servers)")
        elif LAYERS[other] >= LAYERS[unit] and other != unit:
            wrong.append(f"{target} (layer {other} is not below {unit})")
    assert not wrong, f"{me} imports upward: " + "; ".join(wrong)


def test_no_import_cycles() -> None:
    graph = {module_name(p): {t for t in imports_of(p) if t in {module_name(q) for q in FILES}} for p in FILES}
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if seen.get(t) == 1:
                raise AssertionError("import cycle: " + " → ".join(stack[stack.index(t) :] + [t]))
            if t not in seen:
                visit(t)
        stack.pop()
        seen[m] = 2

    for m in graph:
        if m not in seen:
            visit(m)


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module_name(p)) for p in FILES} - {"", BESIDE}
    assert units <= set(LAYERS), f"units without a layer: {sorted(units - set(LAYERS))}"
