"""The executor interface: what a runtime needs from "the thing that runs a job".

A runtime (the node agent's main loop, or a bridge process serving the nodes of a Slurm
partition or a Kubernetes cluster) receives validated protocol messages, calls an
``Executor``, and turns what the executor observes into protocol reports. The engine,
positions, reasons, estimates, approvals and audit never see which executor runs a pool.

Pure standard library: executors run on nodes or bridges that have no Django.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The executor kinds a pool may name (``ResourcePool.executor``).
AGENT = "agent"
SLURM = "slurm"
KUBERNETES = "kubernetes"
KINDS = (AGENT, SLURM, KUBERNETES)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an executor can run and enforce; shown per pool in the API and on the nodes page."""

    images: bool  # can run a job's container image
    gpu_isolation: str  # how a job is kept to its GPUs, in words
    run_as: str  # which identity a job runs as, in words
    limits: tuple[str, ...]  # enforced limits among "cpus", "memory_mb", "pids", "runtime"
    serving: bool  # can give a serving job a port and scrape it
    notes: tuple[str, ...] = ()  # what it does not enforce, in words

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """A node an executor offers, as it registers (``register`` report)."""

    name: str
    gpus: Sequence[Mapping[str, Any]]  # index, uuid, model, memory_mb, as protocol's register
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # e.g. topology


@dataclasses.dataclass(frozen=True)
class Started:
    job_id: int
    attempt: int
    node: str
    pid: int | None = None  # the agent's process group; None where the executor has none
    external_id: str = ""  # Slurm job id, Pod name


@dataclasses.dataclass(frozen=True)
class Exited:
    job_id: int
    attempt: int
    node: str
    exit_code: int | None
    signal: int | None
    reason: str = ""  # one of protocol.EXIT_STOP_REASONS, or "" for an exit of its own
    message: str = ""  # a clear reason for a failure the executor saw (image pull, OOM, ...)


@dataclasses.dataclass(frozen=True)
class LogChunk:
    job_id: int
    attempt: int
    node: str
    offset: int
    data: bytes


@dataclasses.dataclass(frozen=True)
class GpuSample:
    node: str
    index: int
    utilization: float | None  # percent
    memory_used_mb: int | None
    processes: Sequence[Mapping[str, Any]] = ()  # pid, used_memory_mb; for zombie detection


@dataclasses.dataclass(frozen=True)
class Running:
    """A job the executor runs now (for reconciliation after restarts)."""

    job_id: int
    attempt: int
    node: str
    external_id: str = ""


Event = Started | Exited | LogChunk


class Executor(abc.ABC):
    """One kind of executor. Calls come from one runtime thread; implementations need not
    be thread-safe unless they start threads of their own."""

    kind: str

    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abc.abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """The nodes this executor offers now (discovered, not configured by hand)."""

    @abc.abstractmethod
    def launch(self, node: str, message: Mapping[str, Any]) -> None:
        """Start a validated ``launch`` message on ``node`` with the GPUs it names. Never
        blocks on the job; the start is reported by :meth:`poll` as :class:`Started` (or an
        :class:`Exited` with reason ``launch_failed`` and a message)."""

    @abc.abstractmethod
    def stop(self, node: str, message: Mapping[str, Any]) -> None:
        """SIGTERM (or the executor's equivalent), then kill after ``grace_seconds``; the end
        is reported by :meth:`poll` as :class:`Exited` carrying the stop's reason."""

    @abc.abstractmethod
    def poll(self) -> Iterable[Event]:
        """What happened since the last call: starts, exits, log output (within the cap)."""

    @abc.abstractmethod
    def running(self) -> list[Running]:
        """Every job of Sluice's this executor runs now, from its own truth (processes,
        the Slurm controller, the Pods with Sluice's owner labels)."""

    @abc.abstractmethod
    def gpu_samples(self) -> list[GpuSample]:
        """Per-GPU utilisation and memory now, for idle reclaim and insights; empty where
        the executor has no source (say so in :meth:`capabilities`)."""

    def kill_process(self, node: str, pid: int, gpu_index: int) -> bool:
        """Kill a zombie GPU process; executors without process access return False."""
        return False

    def close(self) -> None:
        """Release what the executor holds (connections, threads); jobs keep running."""
        return None
