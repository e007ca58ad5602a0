"""The compiled engine (make native) runs only when it is a build of the sources there."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.engine import native

ROOT = Path(native.__file__).resolve().parent.parent.parent
PROBE = (
    "import scheduling.engine, scheduling.engine.native as n; "
    "print('compiled' if n.is_compiled() else 'pure')"
)

needs_build = pytest.mark.skipif(
    not native.built_modules() or not native.STAMP.exists(),
    reason="no compiled engine here (make native)",
)


def _probe(root: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "SLUICE_PURE_ENGINE"}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )


@pytest.fixture
def copy_of_the_build(tmp_path):
    """The engine package with its compiled modules, alone in a fresh directory."""
    engine = tmp_path / "scheduling" / "engine"
    shutil.copytree(
        ROOT / "scheduling" / "engine", engine, ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "scheduling" / "__init__.py").write_text("")
    for library in ROOT.glob(f"{native.GROUP}__mypyc*.so"):
        shutil.copy(library, tmp_path)
    return tmp_path


@needs_build
def test_a_build_of_the_sources_there_is_the_engine_that_runs(copy_of_the_build):
    assert _probe(copy_of_the_build).stdout.strip() == "compiled"


@needs_build
def test_an_edited_source_makes_the_engine_run_from_its_sources(copy_of_the_build):
    planner = copy_of_the_build / "scheduling" / "engine" / "planner.py"
    planner.write_text(planner.read_text() + "\n# edited after the build\n")
    probe = _probe(copy_of_the_build)
    assert probe.stdout.strip() == "pure"
    assert "older than its sources" in probe.stderr


@needs_build
def test_the_pure_engine_can_be_asked_for(copy_of_the_build):
    assert _probe(copy_of_the_build, SLUICE_PURE_ENGINE="1").stdout.strip() == "pure"


def test_without_a_build_the_engine_is_pure_python(tmp_path):
    engine = tmp_path / "scheduling" / "engine"
    shutil.copytree(
        ROOT / "scheduling" / "engine",
        engine,
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "native.stamp"),
    )
    (tmp_path / "scheduling" / "__init__.py").write_text("")
    assert _probe(tmp_path).stdout.strip() == "pure"


@needs_build
def test_an_incomplete_build_is_not_used(copy_of_the_build):
    for library in copy_of_the_build.glob(f"{native.GROUP}__mypyc*.so"):
        library.unlink()
    probe = _probe(copy_of_the_build)
    assert probe.stdout.strip() == "pure"
    assert "not on the import path" in probe.stderr


@needs_build
def test_a_build_missing_a_module_is_not_used(copy_of_the_build):
    engine = copy_of_the_build / "scheduling" / "engine"
    for module in engine.glob("quota.*.so"):
        module.unlink()
    probe = _probe(copy_of_the_build)
    assert probe.stdout.strip() == "pure"
    assert "lacks quota" in probe.stderr
