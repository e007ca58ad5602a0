"""The engine is pure Python: no Django, nothing else of the project."""

import ast
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[3] / "scheduling" / "engine"
ROOT = ENGINE.parents[1]


def test_importing_the_engine_loads_no_django_and_no_project_module():
    code = (
        "import sys, scheduling.engine\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'portal', 'tenants', 'rest_framework', 'celery')\n"
        "       or (m.startswith('scheduling.') and not m.startswith('scheduling.engine'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_engine_sources_import_only_the_standard_library():
    files = sorted(ENGINE.rglob("*.py"))
    assert files
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                continue  # inside the engine package
            if isinstance(node, ast.ImportFrom):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_scheduling_package_init_stays_empty():
    assert (ENGINE.parent / "__init__.py").read_text().strip() == ""
