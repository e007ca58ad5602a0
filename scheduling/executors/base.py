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
from collections.abc import Callable, Iterable, Mapping, Sequence
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


#: The node label that names a node's topology block (leaf switch, rack or NVLink
#: domain), the default of ``ResourcePool.topology_label``: executors that learn the
#: topology themselves (Slurm) set it.
TOPOLOGY_LABEL = "topology.sluice.io/block"


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
    started_at: float | None = None  # when the command started (None: when reported)
    isolation: Mapping[str, Any] | None = None  # how it runs (``started`` report's field)
    port: int | None = None  # a serving job's port


@dataclasses.dataclass(frozen=True)
class Exited:
    job_id: int
    attempt: int
    node: str
    exit_code: int | None
    signal: int | None
    reason: str = ""  # one of protocol.EXIT_STOP_REASONS, or "" for an exit of its own
    message: str = ""  # a clear reason for a failure the executor saw (image pull, OOM, ...)
    finished_at: float | None = None  # when it ended (None: when reported)


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


@dataclasses.dataclass(frozen=True)
class ServeSamples:
    """One scrape round of a node's serving jobs (``serve_metrics`` report's samples)."""

    node: str
    samples: Sequence[Mapping[str, Any]]


Event = Started | Exited | LogChunk | ServeSamples


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

    def extend(self, node: str, message: Mapping[str, Any]) -> None:
        """The job's runtime limit was raised (an ``extend`` message): an executor with a
        time limit of its own raises its backstop to it. The control side enforces the
        limit itself, so executors without one (the node agent) do nothing."""
        return None

    def kill_process(self, node: str, pid: int, gpu_index: int) -> bool:
        """Kill a zombie GPU process; executors without process access return False."""
        return False

    def close(self) -> None:
        """Release what the executor holds (connections, threads); jobs keep running."""
        return None

    # --- optional hooks of the runtime's loop (the defaults suit a simple executor) ---

    def attach(self, waiter: Any, *, backlog: Callable[[], int], exits_wake: bool) -> None:
        """Called once by the runtime before :meth:`start`: ``waiter`` is the runtime's
        :class:`scheduling.agent.wakeups.LoopWaiter` (an executor may add descriptors to it
        that wake the loop), ``backlog()`` the number of reports waiting to be delivered
        (output stays where it is while it is high), ``exits_wake`` whether descriptors
        added to the waiter wake the loop at all (else the executor is polled)."""
        return None

    def start(self) -> None:
        """Prepare, and take over what a previous run left (called once, before the nodes
        register); events it finds (adopted starts) come from the next :meth:`poll`."""
        return None

    def work(self) -> None:
        """Do what is due in this pass of the loop (notice exits, enforce deadlines, ship
        output); its outcome comes from the next :meth:`poll`."""
        return None

    def due_in(self) -> float:
        """Seconds until :meth:`work` has something to do, at most (the loop's wait)."""
        return 1.0

    def delivered(self, event: Event) -> None:
        """The report carrying ``event`` was delivered to the control side (an exit is then
        reported for good, output up to the chunk's end need never be sent again)."""
        return None

    def settle(self, *, end_of_pass: bool = True) -> None:
        """Write down what changed: before a message is acknowledged (``end_of_pass``
        false) and at the end of each pass (then also tidy per-pass bookkeeping)."""
        return None

    def register_fields(self, node: str) -> dict[str, Any]:
        """The ``register`` report's fields of ``node`` other than its name, pool and the
        protocol's versions."""
        info = next((n for n in self.nodes() if n.name == node), None)
        fields: dict[str, Any] = {
            "hostname": node,
            "cpus": 1,
            "memory_mb": 0,
            "backend": self.kind,
            "gpus": [dict(gpu) for gpu in info.gpus] if info else [],
            "jobs": self.job_summaries(node),
        }
        if info is not None and info.labels:
            fields["labels"] = dict(info.labels)
        return fields

    def heartbeat_fields(self, node: str) -> tuple[dict[str, Any], Callable[[], None] | None]:
        """The ``heartbeat`` report's fields of ``node`` (gpus, jobs, zombies, kills), and
        what to call once that heartbeat is delivered (or None)."""
        gpus = [
            {
                "index": s.index,
                "utilization": s.utilization,
                "memory_used_mb": s.memory_used_mb,
                "processes": [dict(p) for p in s.processes],
            }
            for s in self.gpu_samples()
            if s.node == node
        ]
        return {"gpus": gpus, "jobs": self.job_summaries(node), "zombies": [], "kills": []}, None

    def job_summaries(self, node: str) -> list[dict[str, Any]]:
        """The jobs of ``node`` for ``register`` and ``heartbeat`` (``jobs`` field)."""
        return [
            {
                "job_id": r.job_id,
                "attempt": r.attempt,
                "pid": 0,
                "running": True,
                "stop_reason": None,
            }
            for r in self.running()
            if r.node == node
        ]
