"""GPU discovery and sampling: NVML on real nodes, simulated GPUs everywhere else.

A backend answers two questions: which GPUs does this node have (:meth:`discover`), and what
are they doing now (:meth:`sample`). ``sample`` receives the process group of the job that
holds each GPU; NVML does not need it, the simulated backend derives its readings from it.

GPU model keys
--------------
The scheduler matches jobs to GPUs by a normalized model key ``<FAMILY>-<N>GB``
(``H100-80GB``, ``A100-40GB``, ``L4-24GB``), see :func:`normalize_model_name`. The family is
the product name without vendor words; the GB figure is

1. the size written in the device name (``"NVIDIA A100-SXM4-40GB"`` → 40), unless the
   device's memory contradicts it by more than 25 % (``"NVIDIA GH200 480GB"`` names the
   superchip's combined memory, the GPU has 96 GB);
2. else the marketed size of the family nearest to the device's memory (NVML reports
   81,559 MiB for an 80 GB H100 and 143,771 MiB for a 141 GB H200, so plain rounding of
   the memory would not give the marketed figure);
3. else the memory in GiB, rounded;
4. without any memory figure, the family's only marketed size (``"NVIDIA L4"`` → 24), else
   the family alone.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from scheduling.agent import procfs

logger = logging.getLogger(__name__)

BACKEND_NVML = "nvml"
BACKEND_SIMULATED = "simulated"
DEFAULT_SIMULATION = "8xH100-80GB"

#: Marketed memory sizes (GB) of data-center GPU families, used when a name lacks the size.
MARKETED_SIZES_GB: dict[str, tuple[int, ...]] = {
    "B100": (192,),
    "B200": (180, 192),
    "GB200": (186, 192),
    "H100": (80, 94, 96),
    "H800": (80,),
    "H200": (141,),
    "H20": (96,),
    "GH200": (96, 144),
    "A100": (40, 80),
    "A800": (40, 80),
    "A40": (48,),
    "A30": (24,),
    "A16": (16,),
    "A10": (24,),
    "A10G": (24,),
    "A2": (16,),
    "L40S": (48,),
    "L40": (48,),
    "L20": (48,),
    "L4": (24,),
    "T4": (16,),
    "V100": (16, 32),
    "V100S": (32,),
    "P100": (12, 16),
    "RTXA6000": (48,),
    "RTX6000": (24, 48),
    "RTX4090": (24,),
    "RTX3090": (24,),
}

_VENDOR_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
# Words that describe a variant of the same GPU (form factor, memory type), not the GPU.
_NOISE = re.compile(
    r"^(SXM\d*|PCIE|HBM\d*E?|NVL|MIG|GENERATION|ADA|EDITION|SUPER|TI|\d+GB)$", re.IGNORECASE
)
_SIZE_IN_NAME = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def _family(name: str) -> str:
    """The product family of a device name: ``"NVIDIA A100-SXM4-40GB"`` → ``"A100"``."""
    words = [w for w in re.split(r"[\s\-_]+", name.strip()) if w]
    words = [w for w in words if w.upper() not in _VENDOR_WORDS]
    if not words:
        return "GPU"
    first = words[0].upper()
    # "RTX 4090", "RTX A6000": the number after RTX is the product.
    if first == "RTX" and len(words) > 1 and not _NOISE.match(words[1]):
        return first + words[1].upper()
    return first


def _size_from_memory(family: str, memory_mb: int) -> int:
    gib = memory_mb / 1024
    sizes = MARKETED_SIZES_GB.get(family)
    if sizes:
        return min(sizes, key=lambda size: abs(size - gib))
    return round(gib)


def normalize_model_name(name: str | bytes, memory_mb: int | None = None) -> str:
    """The scheduler's GPU model key for a device name, e.g. ``"H100-80GB"``.

    ``memory_mb`` (total device memory) supplies the size when the name does not say it.
    See the module docstring for the rules.
    """
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    family = _family(name)
    match = _SIZE_IN_NAME.search(name)
    size = int(match.group(1)) if match else None
    if memory_mb:
        if size is None or abs(size - memory_mb / 1024) > 0.25 * size:
            size = _size_from_memory(family, memory_mb)
    elif size is None and len(MARKETED_SIZES_GB.get(family, ())) == 1:
        size = MARKETED_SIZES_GB[family][0]
    return f"{family}-{size}GB" if size else family


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """A GPU as the node registers it."""

    index: int
    uuid: str
    model: str
    name: str
    memory_mb: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class GpuSample:
    """What a GPU is doing now, as sent in each heartbeat."""

    index: int
    uuid: str
    utilization: float | None
    memory_used_mb: int | None
    temperature_c: float | None
    power_w: float | None
    processes: list[dict[str, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class GpuBackend(Protocol):
    """What the agent needs from a GPU backend."""

    name: str

    def discover(self) -> list[GpuInfo]:
        """The node's GPUs, by index."""
        ...

    def sample(self, holders: Mapping[int, int]) -> list[GpuSample]:
        """Current readings; ``holders`` maps a GPU index to the pgid of the job on it."""
        ...

    def close(self) -> None:
        """Release the backend's resources."""
        ...


class GpuBackendError(RuntimeError):
    """The backend cannot be used on this node."""


# --- NVML -----------------------------------------------------------------------------------


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class NvmlBackend:
    """Real GPUs through NVML (the ``pynvml`` module of the nvidia-ml-py package).

    NVML reports host pids; an agent in a container needs the host pid namespace for the
    zombie check to match them against its jobs.
    """

    name = BACKEND_NVML

    def __init__(self, nvml: Any = None) -> None:
        try:
            self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
            self._nvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
            raise GpuBackendError(f"NVML is not available: {exc}") from exc
        self._handles: list[Any] = []
        self._gpus: list[GpuInfo] = []

    def discover(self) -> list[GpuInfo]:
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._gpus = [self._describe(i, h) for i, h in enumerate(self._handles)]
        except Exception as exc:
            raise GpuBackendError(f"NVML discovery failed: {exc}") from exc
        return list(self._gpus)

    def _describe(self, index: int, handle: Any) -> GpuInfo:
        name = _text(self._nvml.nvmlDeviceGetName(handle))
        memory_mb = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))
        return GpuInfo(
            index=index,
            uuid=_text(self._nvml.nvmlDeviceGetUUID(handle)),
            model=normalize_model_name(name, memory_mb),
            name=name,
            memory_mb=memory_mb,
        )

    def sample(self, holders: Mapping[int, int]) -> list[GpuSample]:
        if not self._gpus:
            self.discover()
        return [self._sample_one(gpu, self._handles[gpu.index]) for gpu in self._gpus]

    def _read(self, what: str, call: Any, *args: Any) -> Any:
        """One NVML reading, or None where this GPU does not support it."""
        try:
            return call(*args)
        except Exception as exc:  # NVMLError_NotSupported and friends
            logger.debug("NVML %s unavailable: %s", what, exc)
            return None

    def _sample_one(self, gpu: GpuInfo, handle: Any) -> GpuSample:
        nvml = self._nvml
        rates = self._read("utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._read("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        temperature = self._read(
            "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        power_mw = self._read("power", nvml.nvmlDeviceGetPowerUsage, handle)
        processes = self._read("processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            utilization=float(rates.gpu) if rates is not None else None,
            memory_used_mb=int(memory.used // (1024 * 1024)) if memory is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
            processes=[
                {
                    "pid": int(p.pid),
                    # None under some drivers (e.g. WDDM, or without permission).
                    "memory_mb": int((p.usedGpuMemory or 0) // (1024 * 1024)),
                }
                for p in processes or []
            ],
        )

    def close(self) -> None:
        # Shutting down: nothing useful to do with an error.
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


# --- simulated --------------------------------------------------------------------------------

_SPEC_PART = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?([A-Za-z0-9][A-Za-z0-9 _-]*?)\s*$")
_SIM_UUID_NAMESPACE = uuid.UUID("5b1c3d2e-7f60-4a8b-9c0d-1e2f3a4b5c6d")
# Readings of an idle and a fully busy simulated GPU, roughly those of an H100.
_IDLE_TEMPERATURE_C, _BUSY_TEMPERATURE_C = 32.0, 78.0
_IDLE_POWER_W, _BUSY_POWER_W = 70.0, 650.0


def parse_simulation_spec(spec: str) -> list[tuple[int, str]]:
    """Parse ``"8xH100-80GB"`` or ``"4xA100-40GB,2xL4"`` into ``[(count, model key)]``.

    A model without a size gets its family's marketed size if there is only one
    (``L4`` → ``L4-24GB``).
    """
    parts = [p for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError("empty GPU simulation spec")
    result = []
    for part in parts:
        match = _SPEC_PART.match(part)
        if not match:
            raise ValueError(f"bad GPU simulation spec {part!r}; expected e.g. 8xH100-80GB")
        count = int(match.group(1) or 1)
        if count < 1:
            raise ValueError(f"bad GPU count in {part!r}")
        model = normalize_model_name(match.group(2))
        if not model.endswith("GB"):
            raise ValueError(f"unknown memory size of {model!r}; write e.g. {model}-24GB")
        result.append((count, model))
    return result


@dataclass(slots=True)
class _GroupUsage:
    cpu_seconds: float
    wall: float


class SimulatedBackend:
    """Fake GPUs whose readings follow the jobs that hold them.

    A GPU's utilization is the CPU use of the holding job's whole process group between two
    samples, as a percent of wall time, capped at 100: a busy job looks busy, a sleeping one
    idle, so idle-session reclaim can be tried without GPUs. Memory used follows the group's
    resident memory (capped at the GPU's memory), and the GPU's processes are the group's
    processes. Processes outside jobs never appear, so there are no simulated zombies.
    """

    name = BACKEND_SIMULATED

    def __init__(self, spec: str, node: str) -> None:
        self.spec = spec
        self._gpus: list[GpuInfo] = []
        for count, model in parse_simulation_spec(spec):
            family, size = model.rsplit("-", 1)
            for _ in range(count):
                index = len(self._gpus)
                self._gpus.append(
                    GpuInfo(
                        index=index,
                        uuid=f"GPU-{uuid.uuid5(_SIM_UUID_NAMESPACE, f'{node}/{index}')}",
                        model=model,
                        name=f"Simulated {family} {size}",
                        memory_mb=int(size.removesuffix("GB")) * 1024,
                    )
                )
        self._last: dict[int, _GroupUsage] = {}

    def discover(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self, holders: Mapping[int, int]) -> list[GpuSample]:
        stats = procfs.all_stats() if holders else []
        now = time.monotonic()
        members: dict[int, list[procfs.ProcStat]] = {}
        for stat in stats:
            members.setdefault(stat.pgid, []).append(stat)
        utilization = {
            pgid: self._utilization(pgid, members.get(pgid, []), now)
            for pgid in set(holders.values())
        }
        # Forget groups that no longer hold a GPU, so a reused pgid starts afresh.
        self._last = {pgid: usage for pgid, usage in self._last.items() if pgid in utilization}
        return [
            self._sample_one(gpu, holders.get(gpu.index), members, utilization)
            for gpu in self._gpus
        ]

    def _utilization(self, pgid: int, group: list[procfs.ProcStat], now: float) -> float:
        cpu = sum(s.cpu_seconds for s in group)
        last = self._last.get(pgid)
        self._last[pgid] = _GroupUsage(cpu_seconds=cpu, wall=now)
        if last is None:
            # First look at this job: average over the life of its group leader.
            leader = next((s for s in group if s.pid == pgid), None)
            if leader is None:
                return 0.0
            elapsed = _seconds_since_boot() - leader.start_ticks / procfs.CLOCK_TICKS
            return _percent(cpu, elapsed)
        # Clamp at 0: a member that left the group takes its CPU time with it.
        return _percent(max(cpu - last.cpu_seconds, 0.0), now - last.wall)

    def _sample_one(
        self,
        gpu: GpuInfo,
        pgid: int | None,
        members: Mapping[int, list[procfs.ProcStat]],
        utilization: Mapping[int, float],
    ) -> GpuSample:
        group = members.get(pgid, []) if pgid is not None else []
        busy = utilization.get(pgid, 0.0) if pgid is not None else 0.0
        rss_mb = sum(s.rss_bytes for s in group) // (1024 * 1024)
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            utilization=round(busy, 1),
            memory_used_mb=min(rss_mb, gpu.memory_mb),
            temperature_c=round(_between(_IDLE_TEMPERATURE_C, _BUSY_TEMPERATURE_C, busy), 1),
            power_w=round(_between(_IDLE_POWER_W, _BUSY_POWER_W, busy), 1),
            processes=[{"pid": s.pid, "memory_mb": s.rss_bytes // (1024 * 1024)} for s in group],
        )

    def close(self) -> None:
        pass


def _percent(cpu_seconds: float, wall_seconds: float) -> float:
    if wall_seconds <= 0:
        return 0.0
    return min(100.0, 100.0 * cpu_seconds / wall_seconds)


def _between(low: float, high: float, percent: float) -> float:
    return low + (high - low) * percent / 100.0


def _seconds_since_boot() -> float:
    with open(f"{procfs.PROC}/uptime") as f:
        return float(f.read().split()[0])


# --- selection --------------------------------------------------------------------------------


def select_backend(*, node: str, simulate: str | None = None, nvml: Any = None) -> GpuBackend:
    """``simulate`` forces simulated GPUs; otherwise NVML, falling back to simulated GPUs
    (with a warning) when NVML is missing, fails, or finds no GPU."""
    if simulate:
        return SimulatedBackend(simulate, node)
    try:
        backend = NvmlBackend(nvml)
        if backend.discover():
            return backend
        backend.close()
        reason = "NVML found no GPU"
    except GpuBackendError as exc:
        reason = str(exc)
    logger.warning("%s; simulating %s", reason, DEFAULT_SIMULATION)
    return SimulatedBackend(DEFAULT_SIMULATION, node)
