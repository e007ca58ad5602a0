"""The engine's import contract: no Django and nothing of the project outside the engine,
and dependencies that point down, from the planner (the orchestrator) through its
extension points and the cycle's state to the mechanisms they share.

The layers are read from the sources (every import counts, those made for type checking
only included) and checked in a fresh interpreter in which importing Django fails."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[3] / "scheduling" / "engine"
ROOT = ENGINE.parents[1]

#: Highest first. A module imports only modules of the layers below its own; the base
#: layer (the mechanisms: records, indexes, timelines, rules) may import within itself.
LAYERS: list[tuple[str, set[str]]] = [
    ("package", {"__init__"}),
    ("entry point", {"plan"}),
    ("orchestrator", {"planner"}),
    ("preemption point", {"preempting"}),
    ("reservation and explanation points", {"reserving", "explaining"}),
    ("ordering and placement points, the settled check", {"ordering", "placing", "settled"}),
    ("cycle state", {"cycle"}),
    (
        "mechanisms",
        {
            "cluster",
            "defaults",
            "messages",
            "native",
            "order",
            "preemption",
            "quota",
            "reasons",
            "reservations",
            "results",
            "snapshot",
            "timeline",
            "usage",
        },
    ),
]
EXTENSION_POINTS = {"ordering", "placing", "reserving", "preempting", "explaining"}


def _layer_of(module: str) -> int:
    for number, (_, modules) in enumerate(LAYERS):
        if module in modules:
            return number
    raise AssertionError(f"scheduling/engine/{module}.py is in no layer of the contract")


def _engine_imports(path: Path) -> set[str]:
    """The engine modules ``path`` imports (relative imports; every one, wherever)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        assert node.level == 1, f"{path.name} imports from outside the engine package"
        if node.module:
            found.add(node.module.split(".")[0])
        else:  # from . import messages, reasons
            found.update(alias.name for alias in node.names)
    return found


def _modules() -> dict[str, set[str]]:
    return {path.stem: _engine_imports(path) for path in sorted(ENGINE.glob("*.py"))}


def test_every_engine_module_is_in_a_layer():
    modules = _modules()
    assert {"planner", "cycle", *EXTENSION_POINTS} <= modules.keys()
    for module in modules:
        _layer_of(module)
    for _, members in LAYERS:
        assert members <= modules.keys(), members - modules.keys()


def _upward(modules: dict[str, set[str]]) -> list[str]:
    """The imports of ``modules`` (module -> engine modules it imports) that do not
    point down."""
    base = len(LAYERS) - 1
    found = []
    for module, imported in sorted(modules.items()):
        own = _layer_of(module)
        for other in sorted(imported):
            theirs = _layer_of(other)
            if not (theirs > own or theirs == own == base):
                found.append(f"{module} ({LAYERS[own][0]}) imports {other} ({LAYERS[theirs][0]})")
    return found


def test_dependencies_point_down():
    assert _upward(_modules()) == []


def test_no_extension_point_imports_the_orchestrator_or_another_point_above_it():
    modules = _modules()
    for point in EXTENSION_POINTS:
        assert "planner" not in modules[point], f"{point} imports the planner"
        assert "plan" not in modules[point] and "__init__" not in modules[point]
    # What only reads a cycle sees it through the read-only view, never a point.
    assert not (modules["settled"] & (EXTENSION_POINTS | {"planner"}))


def test_the_settled_check_reads_no_private_attribute_of_another_object():
    tree = ast.parse((ENGINE / "settled.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            owner = node.value
            assert isinstance(owner, ast.Name) and owner.id == "self", (
                f"settled.py line {node.lineno} reads .{node.attr} of another object"
            )


def test_the_contract_catches_an_import_that_points_up(tmp_path):
    # A point importing the planner (even for type checking only), or another point of
    # its own layer, must be refused, or the tests above prove nothing.
    source = tmp_path / "placing.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import reasons\n"
        "if TYPE_CHECKING:\n"
        "    from .planner import Planner\n"
    )
    imported = _engine_imports(source)
    assert imported == {"planner", "reasons"}
    assert _upward({**_modules(), "placing": imported}) == [
        "placing (ordering and placement points, the settled check) imports planner (orchestrator)"
    ]
    assert _upward({**_modules(), "reserving": {"explaining"}}) != []


#: Run in a fresh interpreter: refuse Django, import every engine module, list what came.
_PROBE = r"""
import importlib, importlib.abc, json, sys

class NoDjango(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "django" or fullname.startswith("django."):
            raise ImportError(f"{fullname} imported by the engine")
        return None

sys.meta_path.insert(0, NoDjango())
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.fixture(scope="module")
def loaded() -> list[str]:
    names = [f"scheduling.engine.{module}" for module in _modules() if module != "__init__"]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_every_engine_module_loads_no_django_and_nothing_else_of_the_project(loaded):
    assert "scheduling.engine.planner" in loaded and "scheduling.engine.cycle" in loaded
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert {"portal", "scheduling", "tenants"} <= packages
    project = (packages - {"scheduling"}) | {"django", "rest_framework", "celery"}
    foreign = [
        name
        for name in loaded
        if name.split(".")[0] in project
        or (name.startswith("scheduling.") and not name.startswith("scheduling.engine"))
    ]
    assert foreign == []
