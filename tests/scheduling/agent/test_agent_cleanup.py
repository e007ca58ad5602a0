"""After a job: its directory is emptied but for its state and checkpoints, and removed with
the checkpoints once its retention is over."""

import json
import os

import pytest

from scheduling.agent.protocol import ProtocolError, launch_message, validate_control_message
from tests.scheduling.agent.helpers import ACCOUNT_A, launch, python_job

#: Writes a scratch file in its working directory and a checkpoint where Sluice says.
WRITES_FILES = """
import os
open("scratch.bin", "w").write("x" * 1000)
os.makedirs("tmp/deep", exist_ok=True)
open("tmp/deep/a.txt", "w").write("a")
ckpt = os.environ["SLUICE_CHECKPOINT_DIR"]
open(os.path.join(ckpt, "step-10.pt"), "w").write("weights")
print("done", flush=True)
"""


def _entries(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _cleaned(h, job_id):
    return h.wait_for(
        lambda: h.agent.jobs.get((job_id, 1)) and h.agent.jobs[(job_id, 1)].workspace_cleaned
    )


def test_ended_job_keeps_only_its_state_and_checkpoints(make_agent):
    h = make_agent(heartbeat_seconds=0.05, workspace_grace_seconds=0)
    h.send(launch(1, python_job(WRITES_FILES)))
    assert h.wait_report("exited", 1)["exit_code"] == 0
    _cleaned(h, 1)
    root = h.paths(1).root
    assert _entries(root) == [
        "state.json",
        "workspace",
        "workspace/checkpoints",
        "workspace/checkpoints/step-10.pt",
    ]
    assert (root / "workspace/checkpoints/step-10.pt").read_text() == "weights"
    assert h.log_text(1) == "done\n"  # the output was shipped before it was removed
    assert json.loads(h.paths(1).state.read_text())["workspace_cleaned"] is True


def test_nothing_is_removed_before_the_grace_or_before_the_exit_is_reported(make_agent):
    h = make_agent(heartbeat_seconds=0.05, workspace_grace_seconds=3600)
    h.send(launch(2, python_job(WRITES_FILES)))
    h.wait_report("exited", 2)
    h.wait_for(lambda: h.agent.jobs[(2, 1)].exit_reported)
    h.agent.tick(0.1)
    h.agent.tick(0.1)
    assert (h.workspace(2) / "scratch.bin").exists() and h.paths(2).log.exists()


def test_a_nested_checkpoint_dir_is_kept_and_its_siblings_removed(make_agent):
    h = make_agent(heartbeat_seconds=0.05, workspace_grace_seconds=0)
    code = (
        "import os; open('out/other.txt', 'w').write('x') if os.path.isdir('out') else None;"
        "open(os.path.join(os.environ['SLUICE_CHECKPOINT_DIR'], 'c.pt'), 'w').write('c');"
        "open('out/notes.txt', 'w').write('n')"
    )
    h.send(launch(3, python_job(code), checkpoint_dir="out/ckpt"))
    assert h.wait_report("exited", 3)["exit_code"] == 0
    _cleaned(h, 3)
    assert _entries(h.paths(3).root) == [
        "state.json",
        "workspace",
        "workspace/out",
        "workspace/out/ckpt",
        "workspace/out/ckpt/c.pt",
    ]


def test_directories_outside_the_job_directory_are_never_touched(
    make_agent, tmp_path, job_accounts
):
    # Directories under an allowed root exist beforehand, given to the job's account.
    root = tmp_path / "data" / "nlp"
    work, ckpt = root / "project", root / "ckpt"
    for directory in (root, work, ckpt):
        directory.mkdir(parents=True)
        directory.chmod(0o755)
        if job_accounts:
            os.chown(directory, job_accounts[ACCOUNT_A], -1)
    h = make_agent(
        heartbeat_seconds=0.05,
        workspace_grace_seconds=0,
        retention_check_seconds=0,
        allowed_roots=(str(tmp_path / "data" / "{tenant}"),),
    )
    h.send(
        launch(
            4,
            python_job(WRITES_FILES),
            working_dir=str(work),
            checkpoint_dir=str(ckpt),
            retention_days=0,
            tenant="nlp",
        )
    )
    assert h.wait_report("exited", 4)["exit_code"] == 0
    h.wait_for(lambda: not h.paths(4).root.exists())
    assert (work / "scratch.bin").exists() and (ckpt / "step-10.pt").exists()


def test_retention_from_the_launch_removes_the_directory_with_its_checkpoints(make_agent):
    h = make_agent(heartbeat_seconds=0.05, workspace_grace_seconds=0, retention_check_seconds=0)
    h.send(launch(5, python_job(WRITES_FILES), retention_days=0))
    h.send(launch(6, python_job(WRITES_FILES)))  # the agent's default: 14 days
    h.wait_report("exited", 5)
    h.wait_report("exited", 6)
    h.wait_for(lambda: not h.paths(5).root.exists())
    assert (5, 1) not in h.agent.jobs
    _cleaned(h, 6)
    assert (h.paths(6).checkpoints / "step-10.pt").exists()
    assert not (h.workspace(6) / "scratch.bin").exists()


def test_the_agent_default_retention_applies_to_directories_found_on_disk(make_agent, tmp_path):
    work = tmp_path / "work"
    first = make_agent(work_dir=work, heartbeat_seconds=0.05, workspace_grace_seconds=0)
    first.send(launch(7, python_job("print('hi')")))
    first.wait_report("exited", 7)
    _cleaned(first, 7)
    first.agent.close()
    second = make_agent(work_dir=work, retention_days=0, retention_check_seconds=0)
    second.agent.tick(0)
    assert not first.paths(7).root.exists()


def test_launch_retention_days_is_optional_and_checked():
    assert "retention_days" not in launch_message(
        job_id=1, attempt=0, name="a", command=["x"], gpu_indices=[0]
    )
    message = launch_message(
        job_id=1, attempt=0, name="a", command=["x"], gpu_indices=[0], retention_days=14
    )
    assert message["retention_days"] == 14
    with pytest.raises(ProtocolError, match="retention_days"):
        validate_control_message({**message, "retention_days": "14"})
    with pytest.raises(ProtocolError, match="negative"):
        validate_control_message({**message, "retention_days": -1})
