"""The node agent installs on its own: its wheel (agent/pyproject.toml) is built from the
tree offline, installed into a fresh virtual environment without Django or the checkout,
and runs there: ``sluice-agent --help``, ``--discover --simulate``, ``check-isolation
--help``, and (with its runtime dependencies taken from the project's environment) one
registration on the filesystem broker."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: What the agent needs at run time (agent/pyproject.toml's dependencies).
RUNTIME = ("celery", "kombu", "redis", "nvidia-ml-py")


def _run(args, *, cwd: Path, check=True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CELERY_BROKER_URL")}
    env["PYTHONNOUSERSITE"] = "1"
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    if check:
        assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def _dependency_closure(names) -> dict:
    """The installed distributions ``names`` need, recursively (no extras)."""
    seen: dict = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _link_distributions(dists, into: Path) -> None:
    """Each distribution's top-level files of the project's environment, linked into one
    folder (no network: the agent's dependencies as installed here, Django left out)."""
    into.mkdir()
    for dist in dists.values():
        for path in dist.files or []:
            top = path.parts[0]
            if top in ("..", "__pycache__") or (into / top).exists():
                continue
            source = Path(dist.locate_file(top))
            if source.exists():
                (into / top).symlink_to(source)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A fresh environment (no system site-packages) with only the agent's wheel in it."""
    if not _has_bdist_wheel():
        pytest.skip("setuptools 70.1 or later (requirements-dev.txt) builds a wheel offline")
    base = tmp_path_factory.mktemp("agent-package")
    # The tree the wheel is built from: agent/ and the packages it names, nothing else (the
    # build writes its build/ and egg-info folders there, not into the checkout).
    src = base / "src"
    shutil.copytree(ROOT / "agent", src / "agent", ignore=shutil.ignore_patterns("build", "dist"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "sluice-job-wrapper")
    for package in ("agent", "executors"):
        shutil.copytree(ROOT / "scheduling" / package, src / "scheduling" / package, ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", base / "dist", src / "agent"],
        cwd=base,
    )
    (wheel,) = (base / "dist").glob("sluice_agent-*.whl")

    env_dir = base / "node"
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], cwd=base)
    return {"base": base, "python": python, "bin": env_dir / "bin", "wheel": wheel}


def _has_bdist_wheel() -> bool:
    try:
        import setuptools.command.bdist_wheel  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_wheel_holds_the_agent_and_the_executors_but_not_the_portal(node):
    import zipfile

    names = zipfile.ZipFile(node["wheel"]).namelist()
    assert "scheduling/agent/cli.py" in names
    assert "scheduling/agent/protocol.py" in names
    assert "scheduling/executors/base.py" in names
    assert "scheduling/executors/runtime.py" in names
    assert "scheduling/agent/wrapper.c" in names
    assert "scheduling/agent/isolation_check.py" in names
    assert not any(n.startswith("scheduling/models") or n.startswith("portal/") for n in names)
    assert not any(n.startswith("scheduling/engine/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(node["wheel"]).read(entry_points).decode()
    assert "sluice-agent = scheduling.agent.cli:main" in text


def test_no_django_and_no_checkout_on_the_node(node):
    cwd = node["base"]
    failed = _run([node["python"], "-c", "import django"], cwd=cwd, check=False)
    assert failed.returncode != 0 and "No module named 'django'" in failed.stderr
    where = _run([node["python"], "-c", "import scheduling.agent as a; print(a.__file__)"], cwd=cwd)
    assert where.stdout.strip().startswith(str(node["base"] / "node"))
    assert not Path(where.stdout.strip()).is_relative_to(ROOT)
    portal = _run([node["python"], "-c", "import scheduling.models"], cwd=cwd, check=False)
    assert portal.returncode != 0


def test_the_console_script_and_the_module_run(node):
    cwd = node["base"]
    usage = _run([node["bin"] / "sluice-agent", "--help"], cwd=cwd)
    assert "usage: sluice-agent" in usage.stdout and "--simulate" in usage.stdout
    found = _run(
        [node["python"], "-m", "scheduling.agent", "--discover", "--simulate", "2xH100-80GB"],
        cwd=cwd,
    )
    gpus = json.loads(found.stdout)["gpus"]
    assert [g["model"] for g in gpus] == ["H100-80GB", "H100-80GB"]
    check = _run([node["bin"] / "sluice-agent", "check-isolation", "--help"], cwd=cwd)
    assert "usage: sluice-agent check-isolation" in check.stdout


def test_with_its_dependencies_the_agent_registers_on_the_broker(node):
    dists = _dependency_closure(RUNTIME)
    assert "django" not in dists
    deps = node["base"] / "deps"
    _link_distributions(dists, deps)
    site = _run(
        [node["python"], "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=node["base"],
    ).stdout.strip()
    Path(site, "agent-deps.pth").write_text(f"{deps}\n")
    broker = node["base"] / "broker"
    # Jobs' accounts must reach the agent's work dir (pytest's own folders are private).
    work = Path(tempfile.mkdtemp(prefix="sluice-agent-package-"))
    work.chmod(0o711)
    try:
        _register(node, broker, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert _run([node["python"], "-c", "import django"], cwd=node["base"], check=False).returncode
    reports = []
    for path in broker.glob("*.reports.msg"):
        message = json.loads(path.read_text())
        assert message["headers"]["task"] == "scheduling.agent_reports"
        reports += json.loads(base64.b64decode(message["body"]))[0][0]
    register = next(r for r in reports if r["type"] == "register")
    assert register["node"] == "gpu-01"
    assert [g["model"] for g in register["gpus"]] == ["H100-80GB", "H100-80GB"]


def _register(node, broker: Path, work: Path) -> None:
    _run(
        [
            node["bin"] / "sluice-agent",
            "--node",
            "gpu-01",
            "--simulate",
            "2xH100-80GB",
            "--once",
            "--broker",
            "filesystem://",
            "--broker-dir",
            broker,
            "--work-dir",
            work,
        ],
        cwd=node["base"],
    )
