"""The observe-only sampler (``python -m scheduling.agent --observe-only``) on a node whose
jobs Slurm runs: what it reports, and how the control side combines its ``samples`` with
the bridge's heartbeats (samples on the GPUs Sluice allocated, never a job ended by them)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.agent import cli, observe, procfs, protocol, transport
from scheduling.agent.gpus import GpuSample
from scheduling.choices import JobState
from scheduling.models import Gpu, Job, Node
from scheduling.tasks import agent_report

from .test_agent_reports import _placed_job, _report


def _stat(pid, pgid):
    return procfs.ProcStat(pid, "python", "S", 1, pgid, pgid, 0, 0, 0, 0, 0, 0)


@pytest.fixture
def node_procs(tmp_path, monkeypatch):
    """A fake /proc: {pid: (pgid, environment)}."""
    procs = {}

    def write(pid, pgid, **env):
        procs[pid] = pgid
        (tmp_path / str(pid)).mkdir()
        body = b"".join(f"{k}={v}".encode() + b"\0" for k, v in {"PATH": "/bin", **env}.items())
        (tmp_path / str(pid) / "environ").write_bytes(body)

    monkeypatch.setattr(procfs, "PROC", str(tmp_path))
    monkeypatch.setattr(procfs, "all_stats", lambda: [_stat(p, g) for p, g in procs.items()])
    monkeypatch.setattr(procfs, "process_name", lambda pid: f"proc{pid}")
    return write


class FakeBackend:
    name = "fake"

    def __init__(self, busy=(), processes=None):
        self.busy = set(busy)
        self.processes = processes or {}
        self.holders = None

    def discover(self):
        return []

    def sample(self, holders):
        self.holders = dict(holders)
        return [
            GpuSample(
                index=i,
                uuid=f"GPU-{i}",
                utilization=90.0 if i in self.busy else 0.0,
                memory_used_mb=1000,
                temperature_c=40.0,
                power_w=100.0,
                processes=[{"pid": pid, "memory_mb": 500} for pid in self.processes.get(i, [])],
            )
            for i in range(4)
        ]

    def close(self):
        pass


def test_the_report_says_which_job_holds_which_gpu_and_which_processes_are_zombies(node_procs):
    node_procs(
        100, 100, SLUICE_JOB_ID="7", SLUICE_ATTEMPT="1", SLURM_JOB_ID="55", SLURM_JOB_GPUS="2,3"
    )
    node_procs(
        101, 100, SLUICE_JOB_ID="7", SLUICE_ATTEMPT="1", SLURM_JOB_ID="55", SLURM_JOB_GPUS="2,3"
    )
    node_procs(200, 200, SLURM_JOB_ID="56", SLURM_JOB_GPUS="1")  # someone else's Slurm job
    node_procs(300, 300)  # started outside Slurm: a zombie where it holds a GPU
    backend = FakeBackend(busy={2}, processes={1: [200], 2: [101], 0: [300]})
    report = observe.samples_report("sn1", backend, observe.read_processes())
    assert protocol.validate_report(report) is report
    assert report["type"] == "samples"
    assert report["jobs"] == [{"job_id": 7, "attempt": 1, "gpu_indices": [2, 3]}]
    assert report["zombies"] == [{"gpu_index": 0, "pid": 300, "memory_mb": 500, "name": "proc300"}]
    assert [g["utilization"] for g in report["gpus"]] == [0.0, 0.0, 90.0, 0.0]
    # A simulated GPU follows the process group of the job holding it.
    assert backend.holders == {2: 100, 3: 100}


def test_the_cli_runs_observe_only_and_reads_no_control_queue(monkeypatch, node_procs):
    sent = []

    class Sender:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, report):
            sent.append(report)

        def close(self):
            pass

    def no_queue(*args, **kwargs):
        raise AssertionError("the sampler must not consume the node's control queue")

    monkeypatch.setattr(transport, "CeleryReportSender", Sender)
    monkeypatch.setattr(transport, "KombuMessageSource", no_queue)
    code = cli.main(["--node", "sn1", "--observe-only", "--simulate", "2xH100-80GB", "--once"])
    assert code == 0
    [report] = sent
    assert report["type"] == "samples" and report["node"] == "sn1"
    assert [g["index"] for g in report["gpus"]] == [0, 1]
    assert protocol.validate_report(report)


def _samples(node, *, busy, jobs=(), zombies=()):
    agent_report(
        {
            "type": "samples",
            "node": node.name,
            "sent_at": timezone.now().timestamp(),
            "gpus": [
                {
                    "index": i,
                    "uuid": f"x-{i}",
                    "utilization": 90.0 if i in busy else 0.0,
                    "memory_used_mb": 100 + i,
                    "temperature_c": None,
                    "power_w": None,
                    "processes": [],
                }
                for i in range(8)
            ],
            "jobs": list(jobs),
            "zombies": list(zombies),
        }
    )


def test_samples_land_on_the_gpus_sluice_allocated_and_mark_the_job_active(world):
    job, node = _placed_job(world)
    job = _report("started", node, job, pid=10, started_at=timezone.now().timestamp())
    assert job.state == JobState.RUNNING
    long_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(last_active_at=long_ago)
    sluice = sorted(job.allocations.values_list("gpu__index", flat=True))
    # Slurm gave the job the node's GPUs 5 and 6; they are busy, the others idle.
    zombie = {"gpu_index": 0, "pid": 300, "memory_mb": 500, "name": "stray"}
    _samples(
        node,
        busy={5, 6},
        jobs=[{"job_id": job.pk, "attempt": job.attempt, "gpu_indices": [5, 6]}],
        zombies=[zombie],
    )
    job.refresh_from_db()
    assert job.last_active_at > long_ago
    utilization = dict(Gpu.objects.filter(node=node).values_list("index", "utilization"))
    assert [utilization[i] for i in sluice] == [90.0, 90.0]
    assert sum(1 for v in utilization.values() if v == 90.0) == 2
    # The node's GPU 0 is the first GPU Sluice has not allocated.
    free = sorted(set(range(8)) - set(sluice))
    node.refresh_from_db()
    assert node.zombies == [{**zombie, "gpu_index": free[0]}]


def test_samples_never_end_a_job_and_a_bridge_heartbeat_keeps_their_zombies(world):
    job, node = _placed_job(world)
    job = _report("started", node, job, pid=10, started_at=timezone.now().timestamp())
    zombie = {"gpu_index": 7, "pid": 300, "memory_mb": 500, "name": "stray"}
    _samples(node, busy=set(), jobs=[], zombies=[zombie])
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    # The Slurm bridge's heartbeat: the job, no zombies field (the sampler reports them).
    agent_report(
        {
            "type": "heartbeat",
            "node": node.name,
            "sent_at": timezone.now().timestamp(),
            "gpus": [],
            "jobs": [
                {
                    "job_id": job.pk,
                    "attempt": job.attempt,
                    "pid": 0,
                    "running": True,
                    "stop_reason": None,
                }
            ],
            "outside_jobs": [],
        }
    )
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert len(Node.objects.get(pk=node.pk).zombies) == 1


def test_samples_of_an_unregistered_node_are_ignored(world):
    _samples(Node(name="nowhere"), busy={0})
    assert not Node.objects.filter(name="nowhere").exists()
    assert not Job.objects.exists()
