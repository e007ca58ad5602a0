"""The node side imports no Django: scheduling/executors and scheduling/agent run on nodes
and bridges where Django is neither installed nor wanted. Each module is imported in a
fresh interpreter in which importing Django fails loudly."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Run in a fresh interpreter: refuse Django, import the module, say what happened.
_PROBE = r"""
import importlib, importlib.abc, json, sys

class NoDjango(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "django" or fullname.startswith("django."):
            raise ImportError(f"{fullname} imported on the node side")
        return None

sys.meta_path.insert(0, NoDjango())
name = sys.argv[1]
try:
    importlib.import_module(name)
except ModuleNotFoundError as exc:
    if exc.name and exc.name.split(".")[0] not in ("django", "scheduling"):
        print(json.dumps({"skipped": f"{exc.name} is not installed"}))
        sys.exit(0)
    print(json.dumps({"error": repr(exc)}))
    sys.exit(0)
except ImportError as exc:
    print(json.dumps({"error": repr(exc)}))
    sys.exit(0)
print(json.dumps({"django": sorted(m for m in sys.modules if m.split(".")[0] == "django")}))
"""


def _modules(package: str) -> list[str]:
    path = ROOT / package.replace(".", "/")
    names = [package]
    for info in pkgutil.walk_packages([str(path)], prefix=f"{package}."):
        names.append(info.name)
    return sorted(names)


def _probe(module: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


NODE_MODULES = [
    name
    for name in _modules("scheduling.executors") + _modules("scheduling.agent")
    # The agent's entry point runs the agent when imported.
    if not name.endswith("__main__")
]


def test_the_node_side_modules_are_found():
    assert "scheduling.executors.runtime" in NODE_MODULES
    assert "scheduling.agent.executor" in NODE_MODULES
    assert "scheduling.agent.jobstore" in NODE_MODULES


@pytest.mark.parametrize("module", NODE_MODULES)
def test_imports_no_django(module):
    result = _probe(module)
    if "skipped" in result:
        pytest.skip(f"{module}: {result['skipped']}")
    assert "error" not in result, f"{module}: {result.get('error')}"
    assert result["django"] == [], f"{module} imports {result['django']}"


def test_the_probe_catches_a_module_that_imports_django():
    # A module of the control side: the probe must refuse it, or the test above proves nothing.
    result = _probe("scheduling.models")
    assert "django" in result.get("error", "")
