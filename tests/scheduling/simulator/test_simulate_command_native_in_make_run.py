"""``make run`` compiles the engine first (``make native``) where a C compiler is found, and
without one says in one line what that costs and how to get it, then starts as before."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def fake_venv(tmp_path: Path) -> Path:
    """A venv whose python and honcho only log their arguments, installed already."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    for name in ("python", "honcho"):
        stub = venv / "bin" / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
        stub.chmod(0o755)
    (venv / ".installed").touch()
    return venv


def make_run(tmp_path: Path, cc: str) -> subprocess.CompletedProcess:
    venv = fake_venv(tmp_path)
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "run",
            f"VENV={venv}",
            f"CC={cc}",
            f"PY={venv}/bin/python",
        ],
        cwd=ROOT,
        env={**os.environ, "MAKEFLAGS": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_a_compiler_make_run_says_so_and_starts(tmp_path):
    done = make_run(tmp_path, "no-such-compiler-cc")

    assert done.returncode == 0, done.stderr
    notice = [line for line in done.stdout.splitlines() if "no C compiler" in line]
    assert notice == [
        "no C compiler (no-such-compiler-cc): the scheduling engine runs as pure Python (trace "
        "replays about 2x slower); install one (apt-get install gcc python3-dev), then make native"
    ]
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == "python manage.py migrate --noinput"
    assert calls[-1] == "honcho start -f Procfile"


def test_with_a_compiler_make_run_builds_the_engine_first(tmp_path):
    """Dry run (-n): the recursive make of the engine runs dry too, and shows its build."""
    venv = fake_venv(tmp_path)
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "run", f"VENV={venv}", "CC=sh"],
        cwd=ROOT,
        env={**os.environ, "MAKEFLAGS": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert "tools/build_native.py" in done.stdout
    assert not [line for line in done.stdout.splitlines() if line.startswith("no C compiler")]
    assert not (tmp_path / "calls.log").exists()  # nothing ran
