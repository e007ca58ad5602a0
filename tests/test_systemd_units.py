"""The systemd units of deploy/systemd: each restarts its process on its own, reads its
settings from an EnvironmentFile, and starts a real command of this checkout (the same as
the Procfile's); ``systemd-analyze verify`` accepts them where it is installed."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "deploy" / "systemd"
INSTALL_DIR = "/opt/sluice"
SERVICES = (
    "sluice-web.service",
    "sluice-dispatcher.service",
    "sluice-worker.service",
    "sluice-beat.service",
    "sluice-agent@.service",
)


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file, each key with all its values (keys repeat in systemd)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not KEY=VALUE"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def exec_start(name: str) -> list[str]:
    (command,) = parse_unit(UNITS / name)["Service"]["ExecStart"]
    return shlex.split(command)


def procfile_command(name: str) -> list[str]:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith(f"{name}:"):
            words = shlex.split(line.split(":", 1)[1])
            return words[words.index("--") + 1 :]  # after tools/keep_running.py ... --
    raise AssertionError(f"no {name} in the Procfile")


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("name", SERVICES)
def test_each_unit_restarts_its_process_and_reads_an_environment_file(name):
    unit = parse_unit(UNITS / name)
    service = unit["Service"]
    assert service["Restart"] == ["on-failure"]
    assert float(service["RestartSec"][0]) > 0
    assert service["EnvironmentFile"][0].startswith("/etc/sluice/")
    assert service["WorkingDirectory"] == [INSTALL_DIR]
    assert service["NoNewPrivileges"] == ["yes"]
    assert unit["Install"]["WantedBy"]
    program = exec_start(name)[0]
    assert program.startswith(f"{INSTALL_DIR}/.venv/bin/"), program


@pytest.mark.parametrize("name", [n for n in SERVICES if n != "sluice-agent@.service"])
def test_the_portal_units_run_unprivileged(name):
    service = parse_unit(UNITS / name)["Service"]
    assert service["User"] == ["sluice"]
    assert service["ProtectSystem"] == ["strict"] and service["CapabilityBoundingSet"] == [""]


def test_every_command_names_a_real_part_of_this_checkout():
    web = exec_start("sluice-web.service")
    assert Path(web[0]).name == "gunicorn"
    assert (ROOT / (web[1].replace(".", "/") + ".py")).is_file()  # portal.wsgi
    assert (ROOT / option(web, "--config")).is_file()
    for name in ("sluice-dispatcher.service", "sluice-worker.service", "sluice-beat.service"):
        argv = exec_start(name)
        assert Path(argv[0]).name == "celery" and option(argv, "-A") == "portal"
        assert (ROOT / "portal" / "celery.py").is_file()
    agent = exec_start("sluice-agent@.service")
    assert Path(agent[0]).name == "python" and option(agent, "-m") == "scheduling.agent"
    assert (ROOT / "scheduling" / "agent" / "__main__.py").is_file()
    assert option(agent, "--node") == "%i"
    # Options the agent's command line knows (it exits 2 on an unknown one).
    from scheduling.agent.cli import build_parser

    known = {o for action in build_parser()._actions for o in action.option_strings}
    assert {w for w in agent if w.startswith("--")} <= known


def test_the_units_run_what_the_procfile_runs():
    dispatcher = exec_start("sluice-dispatcher.service")
    worker = exec_start("sluice-worker.service")
    assert dispatcher[1:4] == procfile_command("dispatcher")[1:4] == ["-A", "portal", "worker"]
    assert option(dispatcher, "--queues") == option(procfile_command("dispatcher"), "--queues")
    assert option(worker, "--queues") == option(procfile_command("worker"), "--queues")
    assert exec_start("sluice-beat.service")[3] == "beat"  # the demo's worker runs --beat
    web = exec_start("sluice-web.service")
    assert web[1:4] == procfile_command("web")[1:4]
    # systemd reads %h as a home directory: celery's own %h is written %%h.
    for argv in (dispatcher, worker):
        assert option(argv, "--hostname").endswith("@%%h")


def test_restarting_an_agent_leaves_its_jobs_running():
    service = parse_unit(UNITS / "sluice-agent@.service")["Service"]
    assert service["KillMode"] == ["process"]
    assert service["RestartPreventExitStatus"] == ["2"]  # "cannot start": said in one line
    assert "PrivateDevices" not in service and "ProtectControlGroups" not in service


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verifies_the_units(tmp_path):
    venv = ROOT / ".venv" / "bin"
    if not all((venv / p).exists() for p in ("gunicorn", "celery", "python")):
        pytest.skip("the commands the units start are not installed in .venv")
    for unit in UNITS.iterdir():
        if unit.suffix in (".service", ".target"):
            (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALL_DIR, str(ROOT)))
    names = [n.replace("@.service", "@gpu-01.service") for n in SERVICES] + ["sluice.target"]
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
