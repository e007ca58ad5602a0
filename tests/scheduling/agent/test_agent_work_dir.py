"""Where a root agent keeps job directories when its own work dir is private, what it
records of what it creates on the host, and its jobs stopped with it when asked."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from scheduling.agent import ledger, procfs
from scheduling.agent.agent import AgentStartError
from scheduling.agent.isolation import create_account
from scheduling.agent.protocol import REPORTS_QUEUE, launch_message
from scheduling.agent.transport import broker_connection, send_control_message
from scheduling.agent.workdir import fallback_work_dir, reachable_copy
from tests.scheduling.agent.helpers import (
    ACCOUNT_A,
    IGNORES_SIGTERM,
    IS_ROOT,
    NOT_ROOT_REASON,
    PYTHON,
    launch,
    python_job,
    release,
    wait_until,
    waiting_job,
)
from tests.scheduling.agent.test_agent_transport import read_reports

root_only = pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)
ROOT = Path(__file__).resolve().parents[3]

WRITES_IN_WORKSPACE = (
    "import os; open('made-here', 'w').write(str(os.getuid())); print(os.getcwd(), flush=True)"
)


def _private_dir(tmp_path: Path) -> Path:
    """A folder other users cannot pass, like /root (0700) with a checkout in it."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    return home


@root_only
def test_a_private_work_dir_moves_to_one_the_job_accounts_reach(make_agent, tmp_path):
    configured = _private_dir(tmp_path) / "checkout" / "var" / "agent" / "node-a"
    fallback_root = tmp_path / "lib" / "sluice"
    created = tmp_path / "created.jsonl"
    h = make_agent(work_dir=configured, fallback_work_root=fallback_root, created_ledger=created)
    moved = fallback_work_dir(configured, fallback_root)
    assert h.agent.config.work_dir == moved
    assert not (configured / "jobs").exists()
    for directory in (fallback_root, moved, moved / "jobs"):
        info = os.stat(directory)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o711), directory

    h.send(launch(1, python_job(WRITES_IN_WORKSPACE)))
    exited = h.wait_report("exited", 1)
    assert exited["exit_code"] == 0, h.log_text(1)
    workspace = h.workspace(1)
    assert str(workspace).startswith(str(moved))
    assert (workspace / "made-here").read_text() == str(pwd.getpwnam(ACCOUNT_A).pw_uid)
    assert stat.S_IMODE(os.stat(workspace).st_mode) == 0o700
    # Recorded, so that it can be removed again; the same path on the next start.
    assert [(e["kind"], e["path"]) for e in ledger.entries(created)] == [
        ("dir", str(fallback_root)),
        ("tree", str(moved)),
    ]
    again = make_agent(work_dir=configured, fallback_work_root=fallback_root, start=False)
    again.agent._prepare_work_dir()
    assert again.agent.config.work_dir == moved


@root_only
def test_a_chosen_private_work_dir_is_refused_in_one_line(make_agent, tmp_path):
    private = _private_dir(tmp_path)
    h = make_agent(work_dir=private / "work", start=False)
    with pytest.raises(AgentStartError) as caught:
        h.agent.start()
    message = str(caught.value)
    assert "\n" not in message
    assert f"{private} is not searchable by other users" in message
    assert f"chmod o+x {private}" in message and "--work-dir" in message


@root_only
def test_a_fallback_that_others_may_write_is_refused(make_agent, tmp_path):
    fallback_root = tmp_path / "lib"
    fallback_root.mkdir()
    fallback_root.chmod(0o777)
    h = make_agent(
        work_dir=_private_dir(tmp_path) / "work", fallback_work_root=fallback_root, start=False
    )
    with pytest.raises(AgentStartError, match="is writable by other users"):
        h.agent.start()


def test_a_reachable_work_dir_stays_where_it_is(make_agent, tmp_path):
    h = make_agent(work_dir=tmp_path / "work", fallback_work_root=tmp_path / "lib")
    assert h.agent.config.work_dir == tmp_path / "work"
    assert not (tmp_path / "lib").exists()


# --- the ledger -------------------------------------------------------------------------------


@root_only
def test_created_accounts_are_recorded_and_removed_but_no_other(tmp_path):
    created = tmp_path / "created.jsonl"
    name = f"sluice-l{uuid.uuid4().hex[:8]}"
    entry = create_account(name, created_ledger=created)
    # Found, not made: not recorded (it may be someone else's).
    create_account(ACCOUNT_A, created_ledger=created)
    assert ledger.entries(created) == [
        {"kind": "account", "name": name, "uid": entry.pw_uid, "gid": entry.pw_gid}
    ]
    # A ledger entry for an account that is not the one recorded (another uid) is skipped.
    ledger.record(created, ledger.ACCOUNT, name=ACCOUNT_A, uid=123456, gid=123456)
    assert ledger.remove_created(created) == []
    with pytest.raises(KeyError):
        pwd.getpwnam(name)
    with pytest.raises(KeyError):
        grp.getgrnam(name)
    assert pwd.getpwnam(ACCOUNT_A)
    assert not created.exists()


def test_a_recorded_directory_goes_only_if_an_agent_made_it(tmp_path):
    created = tmp_path / "created.jsonl"
    made, other, shared = tmp_path / "made", tmp_path / "other", tmp_path / "shared"
    for directory in (made, other, shared):
        directory.mkdir()
    (made / ledger.TREE_MARKER).write_text("")
    (made / "jobs").mkdir()
    (other / "keep").write_text("")
    (shared / "someone-elses").mkdir()
    for kind, path in (("dir", shared), ("tree", made), ("tree", other)):
        ledger.record(created, kind, path=str(path))
    problems = ledger.remove_created(created)
    assert not made.exists()
    assert (other / "keep").exists() and (shared / "someone-elses").exists()
    assert problems == [
        f"not removing {other}: it has no {ledger.TREE_MARKER} (not made by an agent)"
    ]
    # What could not be removed stays recorded.
    assert [e["path"] for e in ledger.entries(created)] == [str(other)]


# --- jobs stopped with the agent --------------------------------------------------------------


def test_stop_jobs_on_exit_ends_every_job_group_and_reports_it(make_agent, tmp_path):
    h = make_agent(stop_jobs_on_exit=True, exit_stop_grace_seconds=1.0)
    trigger = tmp_path / "never"
    h.send(launch(1, waiting_job(trigger)))
    h.send(launch(2, python_job(IGNORES_SIGTERM), gpu_indices=[1]))
    started = [h.wait_report("started", job) for job in (1, 2)]
    h.wait_for(lambda: "ready" in h.log_text(2))
    pids = [r["pid"] for r in started]
    h.agent.stop_all_jobs()
    for pid in pids:
        assert not procfs.is_same_process(pid, None), pid
    exits = {r["job_id"]: r for r in h.of_type("exited")}
    assert exits[1]["stop_reason"] == exits[2]["stop_reason"] == "lost"
    assert exits[2]["signal"] == signal.SIGKILL
    release(trigger)


def test_an_agent_told_so_stops_its_jobs_when_it_stops(tmp_path):
    broker_dir = tmp_path / "broker"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "CELERY"))}
    env.update(PYTHONPATH=str(ROOT), SLUICE_BROKER_DIR=str(broker_dir))
    agent = subprocess.Popen(
        [sys.executable, "-m", "scheduling.agent", "--node", "demo-1", "--simulate", "1xL4"]
        + ["--broker", "filesystem://", "--work-dir", str(tmp_path / "work")]
        + ["--heartbeat", "0.5", "--stop-jobs-on-exit"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    job_pid = None
    try:
        with broker_connection("filesystem://", broker_dir) as connection:
            send_control_message(
                connection,
                "demo-1",
                launch_message(
                    job_id=1,
                    attempt=1,
                    name="replica",
                    command=["sleep", "600"],
                    gpu_indices=[0],
                    run_as=ACCOUNT_A,
                ),
            )
        reports = read_reports(
            "filesystem://",
            broker_dir,
            REPORTS_QUEUE,
            timeout=30,
            until=lambda rs: any(r["type"] == "started" for r in rs),
        )
        job_pid = next(r["pid"] for r in reports if r["type"] == "started")
        assert procfs.is_same_process(job_pid, None)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
        wait_until(lambda: not procfs.is_same_process(job_pid, None), timeout=5)
        exited = read_reports(
            "filesystem://",
            broker_dir,
            REPORTS_QUEUE,
            timeout=10,
            until=lambda rs: any(r["type"] == "exited" for r in rs),
        )
        assert [r["stop_reason"] for r in exited if r["type"] == "exited"] == ["lost"]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if job_pid and procfs.is_same_process(job_pid, None):
            os.killpg(job_pid, signal.SIGKILL)
    output = agent.stdout.read()
    assert "Traceback" not in output, output


def test_the_demo_agents_stop_their_jobs_and_record_what_they_create():
    procfile = (ROOT / "Procfile").read_text().splitlines()
    agents = [line for line in procfile if "scheduling.agent" in line]
    assert agents
    for line in agents:
        assert "--stop-jobs-on-exit" in line, line
        assert "--created-ledger var/created.jsonl" in line, line


@root_only
def test_a_program_in_a_private_checkout_is_copied_where_jobs_can_run_it(make_agent, tmp_path):
    script = _private_dir(tmp_path) / "server.py"
    script.write_text("print('serving')\n")
    created = tmp_path / "created.jsonl"
    copy = reachable_copy(script, created_ledger=created, root=tmp_path / "lib")
    assert copy.parent.parent == tmp_path / "lib" and copy.name == "server.py"
    assert copy.parent.name.startswith("programs-")
    (tmp_path / "other").mkdir()
    other_checkout = _private_dir(tmp_path / "other") / "server.py"
    other_checkout.write_text("")
    other_copy = reachable_copy(other_checkout, root=tmp_path / "lib")
    assert other_copy.parent != copy.parent  # its own folder
    shutil.rmtree(other_copy.parent)
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o644
    assert [e["kind"] for e in ledger.entries(created)] == ["dir", "tree"]
    h = make_agent()
    h.send(launch(1, [PYTHON, str(copy)]))
    assert h.wait_report("exited", 1)["exit_code"] == 0
    assert h.log_text(1) == "serving\n"
    # Where the jobs can read it, it is used where it is.
    (tmp_path / "open.py").write_text("")
    assert reachable_copy(tmp_path / "open.py", root=tmp_path / "lib2") == tmp_path / "open.py"
    assert ledger.remove_created(created) == [] and not (tmp_path / "lib").exists()
