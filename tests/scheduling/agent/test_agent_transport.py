"""The agent over a real kombu broker: memory:// in process, filesystem:// in a subprocess
that imports no Django."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from scheduling.agent import procfs
from scheduling.agent.agent import Agent, AgentConfig
from scheduling.agent.gpus import SimulatedBackend
from scheduling.agent.protocol import (
    HEARTBEATS_QUEUE,
    REPORTS_QUEUE,
    REPORTS_TASK,
    launch_message,
    stop_message,
    validate_report,
)
from scheduling.agent.transport import (
    CeleryReportSender,
    KombuMessageSource,
    broker_connection,
    send_control_message,
)
from tests.scheduling.agent.helpers import ACCOUNT_A, PYTHON, wait_until

ROOT = Path(__file__).resolve().parents[3]


def read_reports(
    url, broker_dir, queue_name, *, until=None, timeout=15.0, agent=None, batches=None
):
    """Celery task messages on ``queue_name``, unwrapped to reports (ticking ``agent``);
    each message's list of reports is also appended to ``batches`` when given."""
    reports = []
    deadline = time.monotonic() + timeout
    with broker_connection(url, broker_dir) as connection:
        queue = connection.SimpleQueue(queue_name, accept=["json"])
        try:
            while time.monotonic() < deadline:
                if agent is not None:
                    agent.tick(0.02)
                try:
                    message = queue.get(timeout=0.05)
                except queue.Empty:
                    if until is None:
                        break
                    continue
                assert message.headers["task"] == REPORTS_TASK
                args, kwargs, _ = message.payload
                assert len(args) == 1 and isinstance(args[0], list) and not kwargs
                batch = [validate_report(report) for report in args[0]]
                reports.extend(batch)
                if batches is not None:
                    batches.append(batch)
                message.ack()
                if until is not None and until(reports):
                    return reports
        finally:
            queue.close()
    if until is not None:
        raise AssertionError(f"timed out; got {[r['type'] for r in reports]}")
    return reports


def of_type(reports, kind):
    return [r for r in reports if r["type"] == kind]


def test_agent_over_kombu_memory_transport(tmp_path):
    url = "memory://"
    node = f"mem-{uuid.uuid4().hex[:8]}"
    control = f"reports-{node}"  # the memory broker is shared by the whole test process
    beats = f"heartbeats-{node}"
    sender = CeleryReportSender(url, reports_queue=control, heartbeats_queue=beats)
    agent = Agent(
        AgentConfig(
            node=node,
            work_dir=tmp_path / "work",
            heartbeat_seconds=60,
            poll_seconds=0.05,
            mounts_file="/dev/null",
        ),
        SimulatedBackend("2xL4", node),
        sender,
        KombuMessageSource(node, url),
    )
    agent.start()
    try:
        with broker_connection(url) as connection:
            message = launch_message(
                job_id=1,
                attempt=1,
                name="hello",
                command=[PYTHON, "-c", "import os; print(os.environ['SLUICE_NODE'])"],
                gpu_indices=[1],
                run_as=ACCOUNT_A,
            )
            send_control_message(connection, node, message)
        reports = read_reports(
            url, None, control, agent=agent, until=lambda rs: of_type(rs, "exited")
        )
    finally:
        agent.close()
        sender.close()
    kinds = [r["type"] for r in reports]
    assert kinds[0] == "register" and "heartbeat" not in kinds
    assert [r["type"] for r in read_reports(url, None, beats)] == ["heartbeat"]
    assert kinds.index("started") < kinds.index("log") < kinds.index("exited")
    assert of_type(reports, "exited")[0]["exit_code"] == 0
    assert of_type(reports, "log")[0]["data"] == f"{node}\n"


def _agent_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "CELERY"))}
    env.update(PYTHONPATH=str(ROOT), SLUICE_BROKER_DIR=str(tmp_path / "broker"), **extra)
    return env


def _imported_modules(importtime_stderr: str) -> set[str]:
    """Module names from ``python -X importtime`` output."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def _run_once(tmp_path: Path, python_args: list[str], **extra_env: str):
    return subprocess.run(
        [sys.executable, *python_args]
        + ["--node", "fs-node", "--pool", "general", "--simulate", "2xA100-40GB", "--once"]
        + ["--broker", "filesystem://", "--work-dir", str(tmp_path / "work")],
        cwd=tmp_path,
        env=_agent_env(tmp_path, **extra_env),
        capture_output=True,
        text=True,
        timeout=60,
    )


#: Runs the agent in a process where Django cannot be imported, as on a GPU node without it.
WITHOUT_DJANGO = (
    "import runpy, sys; sys.modules['django'] = None; "
    "sys.argv[0] = 'agent'; runpy.run_module('scheduling.agent', run_name='__main__')"
)


def test_once_over_the_filesystem_broker_without_django(tmp_path):
    result = _run_once(tmp_path, ["-c", WITHOUT_DJANGO])
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "control").exists()  # exchange tables stay in the broker folder

    batches = []
    reports = read_reports("filesystem://", tmp_path / "broker", REPORTS_QUEUE, batches=batches)
    reports += read_reports("filesystem://", tmp_path / "broker", HEARTBEATS_QUEUE)
    # Sent together, the heartbeat apart (drained in batches by the control side).
    assert [r["type"] for r in reports] == ["register", "heartbeat"]
    assert len(batches) == 1
    register, heartbeat = reports
    assert register["node"] == "fs-node" and register["pool"] == "general"
    # The agent says what it enforces (validated by read_reports).
    assert register["isolation"]["device_isolation"] is False
    assert register["isolation"]["run_as_user"] is (os.geteuid() == 0)
    assert [g["model"] for g in register["gpus"]] == ["A100-40GB", "A100-40GB"]
    assert len(heartbeat["gpus"]) == 2


@pytest.mark.parametrize("django_settings", [None, "portal.settings"])
def test_agent_never_sets_django_up(tmp_path, django_settings):
    # Where Django is installed, kombu's JSON module probes django.utils.functional (to
    # encode lazy strings); nothing else of Django may load: no settings, apps or database,
    # even with DJANGO_SETTINGS_MODULE set (Celery's Django fix-up is off in the agent).
    extra = {"DJANGO_SETTINGS_MODULE": django_settings} if django_settings else {}
    result = _run_once(tmp_path, ["-X", "importtime", "-m", "scheduling.agent"], **extra)
    assert result.returncode == 0, result.stderr[-3000:]
    modules = _imported_modules(result.stderr)
    assert "celery" in modules and "scheduling.agent.cli" in modules  # the probe works
    django = {m for m in modules if m == "django" or m.startswith("django.")}
    assert all(
        m == "django" or m.startswith("django.utils.") or m == "django.utils" for m in django
    )
    assert "django.conf" not in modules and not any(m.startswith("portal") for m in modules)
    assert len(read_reports("filesystem://", tmp_path / "broker", REPORTS_QUEUE)) == 1
    assert len(read_reports("filesystem://", tmp_path / "broker", HEARTBEATS_QUEUE)) == 1


def test_agent_process_runs_jobs_and_leaves_them_running_on_sigterm(tmp_path):
    broker_dir = tmp_path / "broker"
    agent = subprocess.Popen(
        [sys.executable, "-m", "scheduling.agent", "--node", "fs-loop", "--simulate", "2xL4"]
        + ["--broker", "filesystem://", "--work-dir", str(tmp_path / "work")]
        + ["--heartbeat", "0.5"],
        cwd=tmp_path,
        env=_agent_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    job_pid = None
    try:
        with broker_connection("filesystem://", broker_dir) as connection:
            send_control_message(
                connection,
                "fs-loop",
                launch_message(
                    job_id=1,
                    attempt=1,
                    name="quick",
                    command=["echo", "hi"],
                    gpu_indices=[0],
                    run_as=ACCOUNT_A,
                ),
            )
            send_control_message(
                connection,
                "fs-loop",
                launch_message(
                    job_id=2,
                    attempt=1,
                    name="long",
                    command=["sleep", "600"],
                    gpu_indices=[1],
                    run_as=ACCOUNT_A,
                ),
            )
            send_control_message(
                connection, "fs-loop", stop_message(job_id=3, attempt=1, reason="cancelled")
            )
        reports = read_reports(
            "filesystem://",
            broker_dir,
            REPORTS_QUEUE,
            timeout=30,
            # Reports are not ordered across jobs or even within one (the filesystem broker
            # orders by millisecond, control workers run in parallel): wait for all.
            until=lambda rs: (
                len(of_type(rs, "exited")) == 2
                and len(of_type(rs, "started")) == 2
                and of_type(rs, "log")
            ),
        )
        exits = {r["job_id"]: r for r in of_type(reports, "exited")}
        assert exits[1]["exit_code"] == 0
        assert exits[3]["stop_reason"] == "cancelled"
        assert [r["data"] for r in of_type(reports, "log")] == ["hi\n"]
        job_pid = next(r["pid"] for r in of_type(reports, "started") if r["job_id"] == 2)

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=15) == 0
        # The agent went away cleanly; its job did not.
        assert procfs.is_same_process(job_pid, None)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if job_pid:
            os.killpg(job_pid, signal.SIGKILL)
    output = agent.stdout.read()
    assert "Traceback" not in output, output


def test_filesystem_messages_appear_only_when_complete(tmp_path, monkeypatch):
    from kombu import Connection

    from scheduling.agent import transport

    folder = tmp_path / "broker"
    seen_before_rename = []
    real_replace = os.replace

    def replace(src, dst):
        # At the moment of the rename the message is complete and not yet visible.
        seen_before_rename.extend(p.name for p in folder.glob("*.msg"))
        assert json.loads(Path(src).read_text())
        real_replace(src, dst)

    monkeypatch.setattr(transport.os, "replace", replace)
    message = launch_message(job_id=1, attempt=1, name="x", command=["true"], gpu_indices=[0])
    with broker_connection("filesystem://", folder) as connection:
        send_control_message(connection, "fs-atomic", message)
    assert seen_before_rename == []
    assert not list(folder.glob("*.tmp"))
    # kombu's own filesystem transport (the control side's default) reads it unchanged.
    options = transport.broker_transport_options("filesystem://", folder)
    with Connection("filesystem://", transport_options=options) as plain:
        queue = plain.SimpleQueue(transport.node_queue("fs-atomic"), accept=["json"])
        received = queue.get(timeout=2)
        assert received.payload == message
        received.ack()
        queue.close()


def test_message_source_survives_an_unreachable_broker(caplog):
    # Nothing listens on this port: the source backs off instead of raising or blocking.
    # The consumer thread owns the connection; get() never waits longer than asked.
    source = KombuMessageSource("n1", "redis://127.0.0.1:1/0", wait_seconds=0.2)
    began = time.monotonic()
    assert source.get(0.2) is None
    assert source.get(0) is None
    assert time.monotonic() - began < 2
    wait_until(lambda: "broker unavailable" in caplog.text, timeout=10)
    began = time.monotonic()
    source.close()
    assert time.monotonic() - began < 5  # close() ends the thread even while it backs off


def test_sender_raises_when_the_broker_is_unreachable():
    sender = CeleryReportSender("redis://127.0.0.1:1/0")
    with pytest.raises(Exception):  # noqa: B017 - any transport error; the outbox retries
        sender({"type": "heartbeat", "node": "n1", "sent_at": 0.0})
    sender.close()


def test_discover_prints_gpus_as_json(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "scheduling.agent", "--discover", "--simulate", "2xH200"],
        cwd=tmp_path,
        env=_agent_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["backend"] == "simulated"
    assert [g["model"] for g in data["gpus"]] == ["H200-141GB", "H200-141GB"]


def test_the_broker_folder_follows_the_var_dir_as_the_portal_does(monkeypatch):
    from scheduling.agent.transport import default_broker_dir

    monkeypatch.delenv("SLUICE_BROKER_DIR", raising=False)
    monkeypatch.delenv("SLUICE_VAR_DIR", raising=False)
    assert default_broker_dir() == "var/broker"
    monkeypatch.setenv("SLUICE_VAR_DIR", "/srv/sluice")
    assert default_broker_dir() == "/srv/sluice/broker"
    monkeypatch.setenv("SLUICE_BROKER_DIR", "/mnt/broker")
    assert default_broker_dir() == "/mnt/broker"
