"""The observe-only node sampler: ``python -m scheduling.agent --observe-only --node NAME``.

On a node whose jobs another executor runs (a Slurm pool: slurmd starts them), the sampler
runs beside it and launches nothing: it reads no control queue (the node's ``launch``,
``stop`` and ``kill_process`` messages go to the pool's bridge) and sends one ``samples``
report every ``--heartbeat`` seconds: per-GPU utilisation, memory and processes (NVML, or
``--simulate``), which Sluice job holds which GPU, and zombie GPU processes. Those feed
idle reclaim, insights and the nodes page. The bridge's heartbeats stay the node's truth
about jobs, liveness and capacity in use; the sampler's reports never end or start a job.

Which job holds which GPU comes from the jobs' processes (root reads every process's
environment): a Sluice job's processes carry ``SLUICE_JOB_ID`` and ``SLUICE_ATTEMPT``, and
under Slurm ``SLURM_JOB_GPUS``, the node's indices of the GPUs Slurm gave it (Slurm picks
them; they need not be the indices Sluice shows). A GPU process that belongs to no Slurm
job (no ``SLURM_JOB_ID``) is a zombie.

Pure standard library plus the agent's GPU backends: no Django.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduling.agent import procfs
from scheduling.agent.gpus import GpuBackend
from scheduling.agent.protocol import SAMPLES, report

logger = logging.getLogger("scheduling.agent.observe")

#: Why the sampler has no queue of its own to answer launches on.
OBSERVE_ONLY_MESSAGE = (
    "this node's Sluice agent runs observe-only: it launches nothing (the pool's bridge runs "
    "jobs here)"
)


@dataclass
class ProcessOwner:
    """What a process's environment says it belongs to."""

    pgid: int
    sluice_job: tuple[int, int] | None  # (job id, attempt)
    slurm_job: str  # "" when not started by Slurm
    slurm_gpus: tuple[int, ...] = ()


@dataclass
class NodeProcesses:
    owners: dict[int, ProcessOwner] = field(default_factory=dict)  # by pid

    def job_gpus(self) -> dict[tuple[int, int], set[int]]:
        """Each Sluice job's GPUs on this node, by the node's indices (``SLURM_JOB_GPUS``)."""
        found: dict[tuple[int, int], set[int]] = {}
        for owner in self.owners.values():
            if owner.sluice_job is not None and owner.slurm_gpus:
                found.setdefault(owner.sluice_job, set()).update(owner.slurm_gpus)
        return found


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"{procfs.PROC}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:  # gone, or not ours to read
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"SLUICE_JOB_ID", b"SLUICE_ATTEMPT", b"SLURM_JOB_ID", b"SLURM_JOB_GPUS"):
            env[key.decode()] = value.decode(errors="replace")
    return env


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(",") if p.strip().isdigit())


def read_processes() -> NodeProcesses:
    """Who owns each process of the node (one pass over /proc)."""
    result = NodeProcesses()
    for stat in procfs.all_stats():
        env = _environ(stat.pid)
        job = None
        if env.get("SLUICE_JOB_ID", "").isdigit() and env.get("SLUICE_ATTEMPT", "").isdigit():
            job = (int(env["SLUICE_JOB_ID"]), int(env["SLUICE_ATTEMPT"]))
        result.owners[stat.pid] = ProcessOwner(
            pgid=stat.pgid,
            sluice_job=job,
            slurm_job=env.get("SLURM_JOB_ID", ""),
            slurm_gpus=_ints(env.get("SLURM_JOB_GPUS", "")),
        )
    return result


def samples_report(node: str, backend: GpuBackend, processes: NodeProcesses) -> dict[str, Any]:
    """One ``samples`` report of the node."""
    job_gpus = processes.job_gpus()
    # A simulated GPU's utilisation follows the CPU use of the process group holding it.
    holders: dict[int, int] = {}
    for owner in processes.owners.values():
        if owner.sluice_job is not None:
            for index in job_gpus.get(owner.sluice_job, ()):
                holders.setdefault(index, owner.pgid)
    gpus, zombies = [], []
    for sample in backend.sample(holders):
        gpus.append(sample.as_dict())
        for proc in sample.processes:
            owner = processes.owners.get(int(proc.get("pid", 0)))
            if owner is None or owner.slurm_job:
                continue  # gone meanwhile, or a process of a Slurm job (Sluice's or not)
            zombies.append(
                {
                    "gpu_index": sample.index,
                    "pid": int(proc["pid"]),
                    "memory_mb": int(proc.get("memory_mb") or 0),
                    "name": procfs.process_name(int(proc["pid"])),
                }
            )
    jobs = [
        {"job_id": job_id, "attempt": attempt, "gpu_indices": sorted(indices)}
        for (job_id, attempt), indices in sorted(job_gpus.items())
    ]
    return report(SAMPLES, node, gpus=gpus, jobs=jobs, zombies=zombies)


def run(
    *,
    node: str,
    backend: GpuBackend,
    send: Callable[[dict[str, Any]], None],
    interval: float,
    once: bool = False,
    read: Callable[[], NodeProcesses] = read_processes,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Sample and report until stopped; a report that cannot be sent is dropped (the next
    one says the same, newer)."""
    if os.geteuid() != 0:
        logger.warning(
            "not root: other accounts' processes are unreadable, so their GPUs are not "
            "attributed to their jobs and their GPU processes may look like zombies"
        )
    while True:
        try:
            send(samples_report(node, backend, read()))
        except Exception:  # the broker away: the next round tries again
            logger.exception("could not send the samples of %s", node)
        if once:
            return
        sleep(interval)
