"""The agent's command line: the isolation options reach the agent, bad ones are refused,
the agent's files are private from the start, and an unusable work dir stops it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.agent import cli
from tests.scheduling.agent.helpers import IS_ROOT, NOT_ROOT_REASON

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def captured(monkeypatch):
    """Run ``cli.main`` up to the agent: the config it would run with, and the umask."""
    seen = {}

    class Sender:
        def __init__(self, *args, **kwargs):
            pass

        def close(self):
            pass

    def run_once(config, backend, sender):
        seen["config"] = config
        seen["umask"] = os.umask(0o077)
        return 0

    monkeypatch.setattr("scheduling.agent.transport.CeleryReportSender", Sender)
    monkeypatch.setattr(cli, "_run_once", run_once)
    old = os.umask(0o022)
    yield seen
    os.umask(old)


def test_isolation_options_reach_the_agent(captured, tmp_path):
    status = cli.main(
        ["--node", "n1", "--simulate", "1xL4", "--once", "--work-dir", str(tmp_path / "w")]
        + ["--create-accounts", "--allowed-root", "/data/{tenant}", "--allowed-root", "/scratch"]
        + ["--log-cap-mb", "2.5", "--cgroup-root", "/sys/fs/cgroup/sluice"]
    )
    assert status == 0
    config = captured["config"]
    assert config.create_accounts is True
    assert config.allowed_roots == ("/data/{tenant}", "/scratch")
    assert config.log_cap_bytes == int(2.5 * 1024 * 1024)
    assert config.cgroup_root == Path("/sys/fs/cgroup/sluice")
    assert captured["umask"] == 0o077  # set by the agent before anything is written


def test_defaults(captured):
    assert cli.main(["--node", "n1", "--simulate", "1xL4", "--once"]) == 0
    config = captured["config"]
    assert (config.create_accounts, config.allowed_roots, config.cgroup_root) == (False, (), None)
    assert config.log_cap_bytes == 100 * 1024 * 1024
    assert (config.serve_ports, config.serve_scrape_seconds) == ((20000, 29999), 2.0)
    assert config.serve_scrape_timeout <= 0.5


def test_serving_options_reach_the_agent(captured):
    argv = ["--node", "n1", "--simulate", "1xL4", "--once"]
    assert cli.main([*argv, "--serve-ports", "21000-21099", "--serve-scrape", "0.5"]) == 0
    config = captured["config"]
    assert (config.serve_ports, config.serve_scrape_seconds) == ((21000, 21099), 0.5)


def test_labels_and_topology_reach_the_agent(captured):
    argv = ["--node", "n1", "--simulate", "1xL4", "--once"]
    argv += ["--label", "rack=r7", "--topology", "leaf-3"]
    assert cli.main(argv) == 0
    assert captured["config"].labels == {"rack": "r7", "topology.sluice.io/block": "leaf-3"}


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--label", "rack"], "expected KEY=VALUE"),
        (["--label", "=r7"], "expected KEY=VALUE"),
        (["--allowed-root", "/"], "--allowed-root '/'"),
        (["--allowed-root", "data/{tenant}"], "give an absolute directory"),
        (["--allowed-root", "/data/../etc"], "no '..'"),
        (["--log-cap-mb", "0"], "--log-cap-mb must be positive"),
        (["--serve-ports", "100-200"], "--serve-ports"),
        (["--serve-ports", "x"], "--serve-ports"),
        (["--serve-scrape", "0"], "--serve-scrape must be positive"),
    ],
)
def test_bad_options_are_refused(args, error, capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["--node", "n1", "--simulate", "1xL4", "--once", *args])
    assert raised.value.code == 2
    assert error in capsys.readouterr().err


@pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)
def test_a_root_agent_with_an_unreachable_work_dir_does_not_start(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "CELERY"))}
    env.update(PYTHONPATH=str(ROOT), SLUICE_BROKER_DIR=str(tmp_path / "broker"))
    result = subprocess.run(
        [sys.executable, "-m", "scheduling.agent", "--node", "n1", "--simulate", "1xL4"]
        + ["--broker", "filesystem://", "--work-dir", str(private / "work")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"cannot start: job accounts cannot reach the work dir {private}/work" in result.stderr
    assert "Traceback" not in result.stderr
