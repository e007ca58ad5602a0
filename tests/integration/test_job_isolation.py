"""Attacks on job isolation, replayed: a job of one tenant against a job of another on one node.

Two jobs run on one agent (in process, as ``tests/scheduling/agent`` drives it: no
database, broker or worker needed): job A of tenant nlp as ``sluice-test-a``, holding a
secret in its environment, its output and its workspace; then job B of tenant vision as
``sluice-test-b`` tries what the security review did and writes down, attempt by attempt,
what happened. Every attempt must be refused by the kernel, and job A must still run
afterwards. Needs root (the agent switches users only then).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduling.agent import procfs
from scheduling.agent.agent import Agent, AgentConfig, LocalMessageSource
from scheduling.agent.gpus import SimulatedBackend
from scheduling.agent.runner import signal_group
from tests.scheduling.agent.helpers import (
    ACCOUNT_A,
    ACCOUNT_B,
    IS_ROOT,
    NOT_ROOT_REASON,
    PYTHON,
    Harness,
    ensure_test_accounts,
    launch,
    stop,
    traversable_temp_dir,
)

pytestmark = pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)

SECRET = "nlp-secret-hf-token-31337"
AGENT_SECRET = "agent-broker-password-4242"

#: Job A: keeps a secret in its environment, its output and its workspace; then waits.
VICTIM = """
import os, time
open("notes.txt", "w").write(os.environ["HF_TOKEN"])
print("output of A:", os.environ["HF_TOKEN"], flush=True)
print("ready", flush=True)
time.sleep(600)
"""

#: Job B: tries each attack and records the outcome as JSON on its output.
ATTACKER = r"""
import errno, json, os, signal
a_dir, jobs_dir, db = os.environ["A_DIR"], os.environ["JOBS_DIR"], os.environ["PORTAL_DB"]
a_pid, a_group = int(os.environ["A_PID"]), int(os.environ["A_GROUP"])
agent_pid = int(os.environ["AGENT_PID"])

def read(path):
    with open(path, "rb") as f:
        return f.read()

attempts = {
    "read A state.json": lambda: read(f"{a_dir}/state.json"),
    "read A output.log": lambda: read(f"{a_dir}/output.log"),
    "read A workspace file": lambda: read(f"{a_dir}/workspace/notes.txt"),
    "write into A workspace": lambda: open(f"{a_dir}/workspace/evil", "w"),
    "list A workspace": lambda: os.listdir(f"{a_dir}/workspace"),
    "list A job dir": lambda: os.listdir(a_dir),
    "list jobs dir": lambda: os.listdir(jobs_dir),
    "read portal database": lambda: read(db),
    "read agent environment": lambda: read(f"/proc/{agent_pid}/environ"),
    "read A environment": lambda: read(f"/proc/{a_pid}/environ"),
    "list A cwd": lambda: os.listdir(f"/proc/{a_pid}/cwd"),
    "SIGSTOP A": lambda: os.kill(a_pid, signal.SIGSTOP),
    "SIGTERM A": lambda: os.kill(a_pid, signal.SIGTERM),
    "SIGKILL A group": lambda: os.killpg(a_group, signal.SIGKILL),
}
results = {}
for name, attempt in attempts.items():
    try:
        got = attempt()
    except OSError as exc:
        results[name] = "denied " + errno.errorcode.get(exc.errno, str(exc.errno))
    else:
        results[name] = "ALLOWED " + repr(got)[:200]
# Sanity: B itself works, so the refusals above are about A, not a broken job.
open("mine.txt", "w").write("ok")
results["own workspace"] = read("mine.txt").decode()
results["env has agent secret"] = any(v == "__AGENT_SECRET__" for v in os.environ.values())
print("RESULTS " + json.dumps(results), flush=True)
""".replace("__AGENT_SECRET__", AGENT_SECRET)


@pytest.fixture
def node(monkeypatch) -> Iterator[tuple[Harness, Path]]:
    """One agent in this process, and a stand-in for the portal's var/ next to it."""
    ensure_test_accounts()
    monkeypatch.setenv("SLUICE_TEST_AGENT_SECRET", AGENT_SECRET)
    for base in traversable_temp_dir():
        source = LocalMessageSource()
        reports: list[dict] = []
        agent = Agent(
            AgentConfig(
                node="iso-node",
                work_dir=base / "agent",
                heartbeat_seconds=60.0,
                poll_seconds=0.05,
                log_interval_seconds=0.1,
                mounts_file="/dev/null",  # no cgroups made on the test machine
            ),
            SimulatedBackend("4xH100-80GB", "iso-node"),
            reports.append,
            source,
        )
        harness = Harness(agent=agent, source=source, reports=reports)
        agent.start()
        try:
            yield harness, base
        finally:
            for record in agent.jobs.values():
                if record.pid and not record.finished:
                    signal_group(record.pid, signal.SIGKILL)
                if record.process is not None:
                    record.process.wait(timeout=5)


def _portal_database(base: Path) -> Path:
    """As the portal makes its var/: a 0700 directory, the database 0600, the portal's."""
    var = base / "portal-var"
    var.mkdir(mode=0o700)
    var.chmod(0o700)
    db = var / "sluice.sqlite3"
    db.write_text("tenant nlp: " + SECRET)
    db.chmod(0o600)
    return db


def test_a_job_cannot_reach_another_tenants_job_the_portal_or_the_agent(node):
    h, base = node
    db = _portal_database(base)
    h.send(
        launch(
            1,
            [PYTHON, "-c", VICTIM],
            tenant="nlp",
            run_as=ACCOUNT_A,
            env={"HF_TOKEN": SECRET},
            gpu_indices=[0],
        )
    )
    victim = h.wait_report("started", 1)
    h.wait_for(lambda: "ready" in h.log_text(1))
    record = h.agent.jobs[(1, 1)]
    a_dir = h.paths(1).root
    # What B is after is there, and would give the secret away if it could be read.
    # The launch message (with the environment) is not kept once the job started.
    assert not (a_dir / "launch.json").exists()
    assert SECRET in (a_dir / "output.log").read_text()
    assert SECRET in (a_dir / "workspace" / "notes.txt").read_text()

    h.send(
        launch(
            2,
            [PYTHON, "-c", ATTACKER],
            tenant="vision",
            run_as=ACCOUNT_B,
            gpu_indices=[1],
            env={
                "A_DIR": str(a_dir),
                "JOBS_DIR": str(h.agent.jobs_dir),
                "PORTAL_DB": str(db),
                "A_PID": str(record.command_pid),
                "A_GROUP": str(victim["pid"]),
                "AGENT_PID": str(os.getpid()),
            },
        )
    )
    exited = h.wait_report("exited", 2)
    assert exited["exit_code"] == 0, h.log_text(2)
    line = next(x for x in h.log_text(2).splitlines() if x.startswith("RESULTS "))
    results = json.loads(line.removeprefix("RESULTS "))

    expected_denials = {
        "read A state.json",
        "read A output.log",
        "read A workspace file",
        "write into A workspace",
        "list A workspace",
        "list A job dir",
        "list jobs dir",
        "read portal database",
        "read agent environment",
        "read A environment",
        "list A cwd",
        "SIGSTOP A",
        "SIGTERM A",
        "SIGKILL A group",
    }
    outcomes = {name: results[name] for name in expected_denials}
    allowed = {name: outcome for name, outcome in outcomes.items() if "denied" not in outcome}
    assert allowed == {}
    assert all(o in ("denied EACCES", "denied EPERM") for o in outcomes.values()), outcomes
    assert results["own workspace"] == "ok"
    assert results["env has agent secret"] is False
    assert SECRET not in h.log_text(2)

    # Job A was neither stopped nor killed.
    stat = procfs.read_stat(record.command_pid)
    assert stat is not None and stat.state not in ("T", "t", "Z", "X")
    h.agent.tick(0.1)
    assert record.running and not h.of_type("exited", 1)
    h.send(stop(1, "cancelled", grace_seconds=1))
    assert h.wait_report("exited", 1)["stop_reason"] == "cancelled"


def test_a_job_sees_only_its_own_gpus_whatever_its_message_says(node):
    h, _ = node
    show = (
        "import os; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES']);"
        "print('NVD=' + os.environ['NVIDIA_VISIBLE_DEVICES'])"
    )
    h.send(
        launch(
            3,
            [PYTHON, "-c", show],
            run_as=ACCOUNT_B,
            gpu_indices=[2],
            env={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NVIDIA_VISIBLE_DEVICES": "all"},
        )
    )
    assert h.wait_report("exited", 3)["exit_code"] == 0
    assert h.log_text(3) == "CVD=2\nNVD=2\n"
