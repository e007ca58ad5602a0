"""Dependencies point down: a module imports only modules of its own layer or of the layers
below it. Read from the source with ``ast`` (every import statement counts, those inside
functions and under ``TYPE_CHECKING`` too), nothing imported.

The layers, lowest first; a module belongs to the entry with the longest matching prefix,
and every module of the apps must belong to one (a new top-level module gets placed here):

0. plain Python, no Django: the scheduling engine, and the node side (agent, executors);
1. the kit every app uses: errors, forms, text, SQL rows, middleware, the API's shared parts;
2. who: tenants, with the accounts, the audit log (they refer to each other) and the
   directory identities (the Unix account a job runs as is read from them);
3. scheduling; 4. inference; 5. insights;
6. the top: the rest of identity (sign-in and sync from a directory, which cancel a
   leaver's jobs) and the portal itself (settings, URLs, the dashboard, the Celery app,
   the demo command).

A layer below announces its events by signals (``scheduling.signals``) that a layer above
connects to in its app config, rather than calling up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

APPS = ("portal", "audit", "accounts", "tenants", "identity", "scheduling", "inference", "insights")

#: (layer, module prefixes), lowest first.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("plain", ("scheduling.engine", "scheduling.agent", "scheduling.executors")),
    (
        "kit",
        (
            "portal.api",
            "portal.csvexport",
            "portal.env",
            "portal.errors",
            "portal.forms",
            "portal.logfilters",
            "portal.middleware",
            "portal.sqlrows",
            "portal.steps",
            "portal.templatetags",
            "portal.text",
            "portal.varfiles",
        ),
    ),
    (
        "tenants",
        (
            "tenants",
            "accounts",
            "audit",
            "identity.choices",
            "identity.migrations",
            "identity.models",
            "identity.selectors",
        ),
    ),
    ("scheduling", ("scheduling",)),
    ("inference", ("inference",)),
    ("insights", ("insights",)),
    ("top", ("identity", "portal")),
]


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(module: str, source: str, *, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every import of the apps in ``source`` (relative ones resolved)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from x import y``: y may be a module of x; the longer name places it better.
            names = [f"{target}.{alias.name}" for alias in node.names]
        else:
            continue
        found.extend((node.lineno, name) for name in names if name.split(".")[0] in APPS)
    return found


def app_modules() -> list[tuple[str, Path]]:
    modules = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            modules.append((module_name(path), path))
    return modules


def upward_imports(module: str, source: str, *, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that go to a higher layer, as ``"line: target"``."""
    own = layer_of(module)
    bad = []
    for line, target in imported(module, source, is_package=is_package):
        theirs = layer_of(target)
        if own is not None and theirs is not None and theirs > own:
            bad.append((line, target))
    return [f"{line}: {target}" for line, target in bad]


def _graph_upward() -> list[str]:
    found = []
    for module, path in app_modules():
        source = path.read_text()
        for entry in upward_imports(module, source, is_package=path.name == "__init__.py"):
            line, _, target = entry.partition(": ")
            found.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return found


def test_every_module_of_the_apps_has_a_layer():
    unplaced = [module for module, _ in app_modules() if layer_of(module) is None]
    assert unplaced == []


def test_dependencies_point_down():
    upward = _graph_upward()
    assert upward == [], "imports that go up a layer:\n" + "\n".join(upward)


def test_the_engine_imports_nothing_of_the_project_but_itself():
    outside = []
    for module, path in app_modules():
        if not module.startswith("scheduling.engine"):
            continue
        for line, target in imported(
            module, path.read_text(), is_package=path.name == "__init__.py"
        ):
            if not target.startswith("scheduling.engine"):
                outside.append(f"{module}:{line} imports {target}")
    assert outside == []


def test_the_dispatch_does_not_import_the_insights():
    source = (ROOT / "scheduling/services/dispatch.py").read_text()
    targets = [t for _, t in imported("scheduling.services.dispatch", source, is_package=False)]
    assert [t for t in targets if t.startswith("insights")] == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "scheduling.services.dispatch",
            "from insights import instrument\n",
            ["1: insights.instrument"],
        ),
        (
            "scheduling.services.dispatch",
            "def f():\n    import insights.metrics\n",
            ["2: insights.metrics"],
        ),
        ("tenants.services", "from scheduling.models import Job\n", ["1: scheduling.models.Job"]),
        ("portal.errors", "from tenants.models import Tenant\n", ["1: tenants.models.Tenant"]),
        ("scheduling.engine.plan", "from scheduling import models\n", ["1: scheduling.models"]),
        ("insights.views.usage", "from .. import usage\n", []),
        ("insights.views.usage", "from ...identity import services\n", ["1: identity.services"]),
        ("insights.selectors", "from inference.models import Service\n", []),
        ("portal.views", "from insights.selectors import insights_for\n", []),
        ("scheduling.services.jobs", "from identity.selectors import unix_user_name\n", []),
        ("identity.selectors", "from scheduling.models import Job\n", ["1: scheduling.models.Job"]),
        ("identity.services", "from scheduling.models import Job\n", []),
    ],
)
def test_the_check_finds_an_import_that_goes_up(module, source, expected):
    assert upward_imports(module, source) == expected
