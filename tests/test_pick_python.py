"""tools/pick_python.py: the interpreter `make` builds .venv with."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.engine import native

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "pick_python.py"


def _load():
    spec = importlib.util.spec_from_file_location("pick_python", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pick_python = _load()


def _info(executable, *, version=(3, 11), venv=True, headers=True, fast=False):
    return {
        "version": list(version),
        "executable": executable,
        "venv": venv,
        "headers": headers,
        "fast": fast,
    }


def test_a_fast_build_with_headers_goes_before_the_first_on_the_path():
    described = [
        _info("/pyenv/python3.11"),
        _info("/usr/bin/python3.11", fast=True),
    ]
    assert pick_python.pick(described) == "/usr/bin/python3.11"


def test_headers_matter_more_than_speed():
    # Without headers the engine cannot be compiled: a pure-Python engine is far slower
    # than any interpreter build difference.
    described = [
        _info("/a", fast=True, headers=False),
        _info("/b"),
    ]
    assert pick_python.pick(described) == "/b"


def test_path_order_decides_between_equals():
    described = [_info("/a", fast=True), _info("/b", fast=True)]
    assert pick_python.pick(described) == "/a"


def test_other_versions_and_interpreters_without_venv_are_never_picked():
    described = [
        _info("/old", version=(3, 10), fast=True),
        _info("/bare", venv=False, fast=True),
        _info("/slow", headers=False),
    ]
    assert pick_python.pick(described) == "/slow"
    assert pick_python.pick(described[:2]) is None


def test_an_interpreter_describes_itself():
    info = pick_python.describe(sys.executable)
    assert info is not None
    assert tuple(info["version"]) == sys.version_info[:2]
    assert info["executable"] == os.path.realpath(sys.executable)
    assert isinstance(info["fast"], bool) and isinstance(info["headers"], bool)


def test_a_name_that_answers_nothing_is_skipped(tmp_path):
    broken = tmp_path / "python3.11"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    assert pick_python.describe(str(broken)) is None


def _run(path_value: str) -> str:
    environment = dict(os.environ, PATH=path_value)
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=environment, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="picks Python 3.11 only")
def test_the_script_prints_the_executable_found_on_the_path(tmp_path):
    (tmp_path / "python3.11").symlink_to(sys.executable)
    assert _run(str(tmp_path)) == os.path.realpath(sys.executable)


def test_without_any_python_on_the_path_it_falls_back_to_python3(tmp_path):
    assert _run(str(tmp_path)) == "python3"


def test_the_benchmarks_say_which_interpreter_ran():
    described = native.interpreter()
    assert described.startswith(".".join(str(part) for part in sys.version_info[:3]))
    assert sys.executable in described
