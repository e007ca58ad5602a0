"""``sluice-agent check-isolation``: the agent package's isolation check, reached through the
agent's command line; its arguments, its refusal to run as anyone but root, its verdicts,
and (as root) a whole run on simulated GPUs."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.agent import cli, isolation_check
from tests.scheduling.agent.helpers import IS_ROOT, NOT_ROOT_REASON

ROOT = Path(__file__).resolve().parents[3]


def test_the_subcommand_reaches_the_check_with_its_arguments(monkeypatch):
    seen = []
    monkeypatch.setattr(isolation_check, "main", lambda argv: seen.append(argv) or 7)

    assert cli.main(["check-isolation", "--simulate", "2xL4-24GB", "--out", "/tmp/x"]) == 7
    assert seen == [["--simulate", "2xL4-24GB", "--out", "/tmp/x"]]


def test_without_the_subcommand_the_agent_runs(monkeypatch):
    monkeypatch.setattr(isolation_check, "main", lambda argv: pytest.fail("check started"))

    with pytest.raises(SystemExit) as exited:
        cli.main(["--simulate", "1xH100-80GB"])  # the agent, missing its --node
    assert exited.value.code == 2


def test_the_agents_help_names_the_subcommand(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "check-isolation" in capsys.readouterr().out


def test_the_subcommands_help(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["check-isolation", "--help"])

    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert out.startswith("usage: sluice-agent check-isolation")
    for option in ("--simulate", "--out", "--cgroup-root", "--a-seconds", "--deadline"):
        assert option in out


def test_defaults_and_given_values_are_parsed():
    parse = isolation_check.build_parser().parse_args

    defaults = parse([])
    given = parse(["--simulate", "1xH100-80GB", "--out", "o", "--cgroup-root", "/c"])
    timed = parse(["--a-seconds", "2.5", "--deadline", "60"])

    assert (defaults.simulate, defaults.out, defaults.cgroup_root) == (None, None, None)
    assert (defaults.a_seconds, defaults.deadline) == (15.0, 150.0)
    assert (given.simulate, given.out, given.cgroup_root) == ("1xH100-80GB", "o", "/c")
    assert (timed.a_seconds, timed.deadline) == (2.5, 60.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--deadline", "0"], "--deadline: '0': give a positive number of seconds"),
        (["--a-seconds", "-1"], "--a-seconds: '-1': give a positive number of seconds"),
        (["--a-seconds", "nan"], "--a-seconds: 'nan': give a positive number of seconds"),
        (["--deadline", "soon"], "--deadline: 'soon' is not a number of seconds"),
        (["--simulate", "8xH100"], "--simulate: unknown memory size of 'H100'"),
        (["--simulate", "0xL4-24GB"], "--simulate: bad GPU count"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_are_refused_naming_the_option(capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        cli.main(["check-isolation", *args])

    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_not_root_it_says_so_and_starts_nothing(monkeypatch, capsys):
    monkeypatch.setattr(isolation_check.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(isolation_check, "Run", lambda *a, **k: pytest.fail("agent started"))

    assert cli.main(["check-isolation", "--simulate", "1xH100-80GB"]) == 2
    assert "run as root" in capsys.readouterr().out


def test_the_agent_it_starts_imports_the_package_it_came_from():
    assert (isolation_check.PACKAGE_ROOT / "scheduling" / "agent" / "cli.py").is_file()


# --- verdicts on what the jobs printed ---------------------------------------------------------


def _exited(sig=None, message="exited"):
    return {"signal": sig, "message": message}


def test_memory_verdict():
    killed = "allocated 64 MiB\nallocated 192 MiB\n"

    ok, detail = isolation_check.judge_memory(_exited(signal.SIGKILL), killed)
    survived, _ = isolation_check.judge_memory(_exited(), killed + "MEM_SURVIVED\n")

    assert ok and detail["allocated_before_kill_mib"] == 192
    assert not survived


@pytest.mark.parametrize(
    ("pids", "ok"),
    [
        ({"error": "EAGAIN", "started": 62}, True),
        ({"error": "EAGAIN", "started": 64}, False),  # the limit did not hold
        ({"error": None, "started": 200}, False),
        ({"error": "EAGAIN", "started": 0}, False),
    ],
)
def test_pids_verdict(pids, ok):
    text = f"PIDS {json.dumps(pids)}\n"

    assert isolation_check.judge_pids(_exited(), text)[0] is ok


@pytest.mark.parametrize(
    ("cpu", "ok"),
    [
        ({"cpu_per_s": 0.5, "cpu.stat": {"nr_throttled": 12}}, True),
        ({"cpu_per_s": 0.5}, True),  # the job could not read cpu.stat
        ({"cpu_per_s": 0.95, "cpu.stat": {"nr_throttled": 12}}, False),
        ({"cpu_per_s": 0.4, "cpu.stat": {"nr_throttled": 0}}, False),
        ({}, False),
    ],
)
def test_cpu_verdict(cpu, ok):
    text = f"noise\nCPU {json.dumps(cpu)}\n"

    assert isolation_check.judge_cpu(_exited(), text)[0] is ok


def test_tagged_and_marker_lines():
    text = 'x\nINFO {"a": 1}\nA_SIGTERM 12.5\nBAD {nope\n'

    assert isolation_check.tagged(text, "INFO") == {"a": 1}
    assert isolation_check.tagged(text, "BAD") is None
    assert isolation_check.tagged(text, "MISSING") is None
    assert isolation_check.marker(text, "A_SIGTERM") == 12.5
    assert isolation_check.marker(text, "A_EXITED") is None


# --- a whole run ---------------------------------------------------------------------------------


@pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)
def test_a_simulated_run_passes_as_root(tmp_path):
    """The check run as an operator runs it, on simulated GPUs: an agent process, two
    tenants' jobs, nothing failed (GPU and, without cgroup v2, limit checks skipped)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL",)}
    done = subprocess.run(
        [sys.executable, "-m", "scheduling.agent", "check-isolation"]
        + ["--simulate", "1xH100-80GB", "--a-seconds", "4", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads((tmp_path / "isolation_summary.json").read_text())
    statuses = {item["check"]: item["status"] for item in summary["checks"]}
    assert summary["failed"] == 0 and summary["passed"] >= 10, statuses
    assert statuses["4b B's attempts on A and the agent refused (EACCES/EPERM)"] == "PASS"
    assert (tmp_path / "agent.log").exists() and (tmp_path / "reports.jsonl").exists()
