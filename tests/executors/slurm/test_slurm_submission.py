"""What the Slurm executor hands to sbatch, and the launches it refuses, without a controller
(the daemons' side is tests/integration/test_slurm_executor.py)."""

import os
import subprocess

import pytest

from scheduling.agent import protocol
from scheduling.executors.base import Exited
from scheduling.executors.slurm.client import SlurmClient
from scheduling.executors.slurm.executor import NO_PYXIS_MESSAGE, SlurmExecutor


class RecordingClient(SlurmClient):
    """Records submissions instead of running sbatch."""

    def __init__(self):
        super().__init__(partition="sluice")
        self.submitted = []

    def submit(self, script, options):
        self.submitted.append((script, list(options)))
        return str(100 + len(self.submitted))


def _message(**extra):
    fields = {
        "job_id": 7,
        "attempt": 2,
        "name": "train",
        "command": ["python train.py --lr 'a b'"],
        "shell": True,
        "gpu_indices": [0, 1],
        "grace_seconds": 30,
        "run_as": "nobody",
        "env": {"LR": "0.1", "LD_PRELOAD": "/evil.so", "SLUICE_JOB_ID": "1"},
    }
    fields.update(extra)
    message = protocol.launch_message(**fields)
    message.update({k: v for k, v in extra.items() if k not in fields})
    return message


@pytest.fixture
def executor(tmp_path):
    return SlurmExecutor(client=RecordingClient(), work_dir=tmp_path)


def test_image_refused_without_pyxis(executor):
    message = _message()
    message["image"] = "nvcr.io/nvidia/pytorch:24.01-py3"
    executor.launch("sn1", message)
    (event,) = list(executor._events)
    assert isinstance(event, Exited) and event.reason == protocol.LAUNCH_FAILED
    assert event.message == NO_PYXIS_MESSAGE
    assert executor.client.submitted == []
    assert executor.capabilities().images is False


@pytest.mark.skipif(os.geteuid() != 0, reason="--uid/--gid are only given as root")
def test_pinned_submission_options(executor, tmp_path):
    message = _message(limits={"cpus": 2.5, "memory_mb": 4096})
    message["runtime_limit_seconds"] = 3600
    executor.launch("sn3", message)
    ((script, options),) = executor.client.submitted
    assert "--nodelist=sn3" in options and "--gres=gpu:2" in options
    assert "--job-name=sluice-7-2" in options and "--comment=sluice:7:2" in options
    assert "--partition=sluice" in options and "--no-requeue" in options
    assert "--cpus-per-task=3" in options and "--mem=4096M" in options
    assert "--time=62" in options  # the runtime limit plus the grace, in minutes, plus one
    uid = int(subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True).stdout)
    assert f"--uid={uid}" in options
    assert f"--output={tmp_path}/jobs/7-2/output.log" in options
    assert not any(o.startswith("--container-image") for o in options)


def test_script_environment_and_quoting(executor, tmp_path):
    executor.launch("sn3", _message())
    ((script, _),) = executor.client.submitted
    assert "export LR=0.1" in script
    assert "LD_PRELOAD" not in script  # reserved names dropped
    assert "export SLUICE_JOB_ID=7" in script and "export SLUICE_NODE=sn3" in script
    assert 'export NVIDIA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-none}"' in script
    assert "CUDA_VISIBLE_DEVICES=" not in script.replace("${CUDA_VISIBLE_DEVICES", "")
    last = script.strip().splitlines()[-1]
    assert last == "exec /bin/sh -c 'python train.py --lr '\"'\"'a b'\"'\"'' train"
    # Run the script's exec line's command through a shell: the argv survives quoting.
    out = subprocess.run(
        ["/bin/sh", "-c", last.replace("exec /bin/sh -c", "printf '%s\\n'")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines() == ["python train.py --lr 'a b'", "train"]


def test_pyxis_pool_passes_the_image(tmp_path):
    executor = SlurmExecutor(client=RecordingClient(), work_dir=tmp_path, pyxis=True)
    message = _message()
    message["image"] = "nvcr.io/nvidia/pytorch:24.01-py3"
    executor.launch("sn1", message)
    ((_, options),) = executor.client.submitted
    assert "--container-image=nvcr.io/nvidia/pytorch:24.01-py3" in options
    assert executor.capabilities().images is True


@pytest.mark.skipif(os.geteuid() != 0, reason="accounts are looked up only as root")
def test_unknown_account_fails_the_launch_with_its_name(executor):
    executor.launch("sn1", _message(run_as="sluice-nosuchtenant"))
    (event,) = list(executor._events)
    assert event.reason == protocol.LAUNCH_FAILED and "'sluice-nosuchtenant'" in event.message
    assert executor.client.submitted == []


@pytest.mark.parametrize(
    ("runtime", "grace", "minutes"),
    [(3600, 30, 62), (3601, 60, 63), (60, 0, 2), (7200, 300, 126)],
)
def test_time_limit_is_the_runtime_limit_rounded_up_a_grace_and_a_minute_later(
    tmp_path, runtime, grace, minutes
):
    executor = SlurmExecutor(client=RecordingClient(), work_dir=tmp_path)
    message = _message(grace_seconds=grace, runtime_limit_seconds=runtime)
    executor.launch("sn1", message)
    ((_, options),) = executor.client.submitted
    assert [o for o in options if o.startswith("--time=")] == [f"--time={minutes}"]


def test_no_time_limit_without_a_runtime_limit(executor):
    executor.launch("sn1", _message())
    ((_, options),) = executor.client.submitted
    assert not any(o.startswith("--time") for o in options)
