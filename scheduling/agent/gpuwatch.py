"""The GPUs of this node: their samples for heartbeats (utilisation, memory, processes),
the GPU processes no job accounts for (zombies), and killing one on request (part of the
node agent's :class:`~scheduling.agent.executor.LocalProcessExecutor`)."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from scheduling.agent import procfs
from scheduling.agent.gpus import GpuBackend, GpuSample
from scheduling.agent.jobstore import JobStore
from scheduling.agent.runner import JobRecord

logger = logging.getLogger(__name__)


class GpuWatch:
    """Samples the node's GPUs through its backend and tells jobs' processes from others."""

    def __init__(self, backend: GpuBackend, store: JobStore) -> None:
        self.backend = backend
        self.store = store
        self.gpus = backend.discover()
        #: Outcomes of ``kill_process`` messages, in every heartbeat until one is delivered.
        self.kills: list[dict[str, Any]] = []

    def sample(self) -> list[GpuSample]:
        holders = {index: r.pid for r in self.store.running() for index in r.gpu_indices if r.pid}
        try:
            return self.backend.sample(holders)
        except Exception as exc:  # a GPU library hiccup must not stop job supervision
            logger.warning("cannot sample GPUs: %s", exc)
            return []

    def kill_process(self, pid: int, gpu_index: int) -> bool:
        """SIGKILL a GPU process no job on that GPU accounts for; the outcome goes in the
        next heartbeats (``kills``)."""
        killed, words = self._kill_zombie(pid)
        logger.info("kill_process %s on GPU %s: %s", pid, gpu_index, words)
        self.kills.append({"pid": pid, "gpu_index": gpu_index, "killed": killed, "message": words})
        return killed

    def kills_delivered(self, kills: list[dict[str, Any]]) -> None:
        self.kills = [k for k in self.kills if k not in kills]

    def _kill_zombie(self, pid: int) -> tuple[bool, str]:
        samples = self.sample()
        if all(pid != p["pid"] for sample in samples for p in sample.processes):
            return False, "not a GPU process (any more)"
        owner = self.job_of(pid)
        if owner is not None and all(
            pid != p["pid"] or sample.index in owner.gpu_indices
            for sample in samples
            for p in sample.processes
        ):
            return False, "belongs to a running job on its own GPUs; stop the job instead"
        if procfs.read_stat(pid) is None:
            return False, "not visible to the agent (another pid namespace?)"
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False, "already gone"
        except PermissionError:
            return False, "not permitted to kill it"
        return True, "killed with SIGKILL"

    def job_of(self, pid: int) -> JobRecord | None:
        """The running job ``pid`` is part of: in its process group or descending from its
        leader (a job's child that started its own session is still the job's)."""
        leaders = {r.pid: r for r in self.store.running()}
        stat = procfs.read_stat(pid)
        for _ in range(64):  # bounded walk up the parent chain
            if stat is None:
                return None
            record = leaders.get(stat.pgid) or leaders.get(stat.pid)
            if record is not None:
                return record
            if stat.ppid <= 1:
                return None
            stat = procfs.read_stat(stat.ppid)
        return None

    def zombies(self, samples: list[GpuSample]) -> list[dict[str, Any]]:
        """GPU processes that no job holding that GPU accounts for: leftovers of no job,
        and a job's process on a GPU it was not given (it reset CUDA_VISIBLE_DEVICES
        itself: without device isolation only this report catches it)."""
        zombies = []
        for sample in samples:
            for process in sample.processes:
                owner = self.job_of(process["pid"])
                if owner is not None and sample.index in owner.gpu_indices:
                    continue
                name = procfs.process_name(process["pid"])
                if owner is not None:
                    name = f"{name} (job {owner.job_id}, outside its GPUs)"
                    logger.warning(
                        "job %s attempt %s uses GPU %s, which it was not given (pid %s)",
                        owner.job_id,
                        owner.attempt,
                        sample.index,
                        process["pid"],
                    )
                zombies.append(
                    {
                        "gpu_index": sample.index,
                        "pid": process["pid"],
                        "memory_mb": process["memory_mb"],
                        "name": name,
                    }
                )
        return zombies
