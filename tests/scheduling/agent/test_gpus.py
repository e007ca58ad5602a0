"""GPU backends: model keys, NVML through a fake pynvml, simulated GPUs, selection."""

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from scheduling.agent.gpus import (
    GpuBackendError,
    NvmlBackend,
    SimulatedBackend,
    normalize_model_name,
    parse_simulation_spec,
    select_backend,
)


@pytest.mark.parametrize(
    ("name", "memory_mb", "model"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", None, "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("Tesla V100-SXM2-32GB", 32768, "V100-32GB"),
        ("Tesla V100-PCIE-16GB", None, "V100-16GB"),
        ("NVIDIA L4", 23034, "L4-24GB"),
        ("NVIDIA L4", None, "L4-24GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB"),
        ("Tesla T4", 15360, "T4-16GB"),
        (b"NVIDIA A10G", 23028, "A10G-24GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX4090-24GB"),
        ("NVIDIA RTX A6000", 49140, "RTXA6000-48GB"),
        # The name gives the superchip's combined memory; the GPU's own memory wins.
        ("NVIDIA GH200 480GB", 97871, "GH200-96GB"),
        # Unknown family: the memory in GiB, rounded.
        ("NVIDIA Z9", 30720, "Z9-30GB"),
        ("NVIDIA Z9", None, "Z9"),
    ],
)
def test_normalize_model_name(name, memory_mb, model):
    assert normalize_model_name(name, memory_mb) == model


# --- NVML with a fake pynvml ------------------------------------------------------------


class NVMLError(Exception):
    pass


def fake_pynvml(devices):
    """A stand-in for the pynvml module over a list of device dicts."""

    def handle(index):
        return devices[index]

    def power(dev):
        if dev.get("power_mw") is None:
            raise NVMLError("Not Supported")
        return dev["power_mw"]

    mib = 1024 * 1024
    return SimpleNamespace(
        NVMLError=NVMLError,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda dev: dev["name"],
        nvmlDeviceGetUUID=lambda dev: dev["uuid"],
        nvmlDeviceGetMemoryInfo=lambda dev: SimpleNamespace(
            total=dev["total_mb"] * mib, used=dev["used_mb"] * mib, free=0
        ),
        nvmlDeviceGetUtilizationRates=lambda dev: SimpleNamespace(gpu=dev["util"], memory=0),
        nvmlDeviceGetTemperature=lambda dev, sensor: dev["temp"],
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetComputeRunningProcesses=lambda dev: [
            SimpleNamespace(pid=pid, usedGpuMemory=mb * mib if mb is not None else None)
            for pid, mb in dev["procs"]
        ],
    )


DEVICES = [
    {
        "name": b"NVIDIA H100 80GB HBM3",
        "uuid": b"GPU-aaaa",
        "total_mb": 81559,
        "used_mb": 40000,
        "util": 97,
        "temp": 71,
        "power_mw": 612345,
        "procs": [(4242, 39000), (4243, None)],
    },
    {
        "name": "NVIDIA L4",
        "uuid": "GPU-bbbb",
        "total_mb": 23034,
        "used_mb": 0,
        "util": 0,
        "temp": 35,
        "power_mw": None,
        "procs": [],
    },
]


def test_nvml_backend_discovers_and_samples():
    backend = NvmlBackend(fake_pynvml(DEVICES))
    gpus = backend.discover()
    assert [(g.index, g.uuid, g.model, g.memory_mb) for g in gpus] == [
        (0, "GPU-aaaa", "H100-80GB", 81559),
        (1, "GPU-bbbb", "L4-24GB", 23034),
    ]
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"
    first, second = backend.sample({})
    assert (first.utilization, first.memory_used_mb, first.temperature_c) == (97.0, 40000, 71.0)
    assert first.power_w == 612.3
    assert first.processes == [{"pid": 4242, "memory_mb": 39000}, {"pid": 4243, "memory_mb": 0}]
    # A reading the GPU does not support is None, not an error.
    assert second.power_w is None
    assert second.processes == []


def test_nvml_init_failure_is_a_backend_error():
    broken = fake_pynvml(DEVICES)
    broken.nvmlInit = lambda: (_ for _ in ()).throw(NVMLError("Driver Not Loaded"))
    with pytest.raises(GpuBackendError, match="Driver Not Loaded"):
        NvmlBackend(broken)


def test_select_backend_prefers_nvml_then_falls_back(caplog):
    assert select_backend(node="n", nvml=fake_pynvml(DEVICES)).name == "nvml"
    empty = select_backend(node="n", nvml=fake_pynvml([]))
    assert empty.name == "simulated"
    assert len(empty.discover()) == 8
    assert {g.model for g in empty.discover()} == {"H100-80GB"}
    assert "NVML found no GPU" in caplog.text
    forced = select_backend(node="n", simulate="2xL4", nvml=fake_pynvml(DEVICES))
    assert forced.name == "simulated"


# --- simulated --------------------------------------------------------------------------


def test_simulation_spec():
    assert parse_simulation_spec("8xH100-80GB") == [(8, "H100-80GB")]
    assert parse_simulation_spec("4xA100-40GB, 2xL4") == [(4, "A100-40GB"), (2, "L4-24GB")]
    assert parse_simulation_spec("H200") == [(1, "H200-141GB")]
    for bad in ("", "0xH100-80GB", "3xZ9", "x,"):
        with pytest.raises(ValueError):
            parse_simulation_spec(bad)


def test_simulated_gpus_are_stable_per_node():
    a = SimulatedBackend("4xA100-40GB,2xL4-24GB", "node-a").discover()
    again = SimulatedBackend("4xA100-40GB,2xL4-24GB", "node-a").discover()
    other = SimulatedBackend("4xA100-40GB,2xL4-24GB", "node-b").discover()
    assert [g.index for g in a] == [0, 1, 2, 3, 4, 5]
    assert [g.model for g in a] == ["A100-40GB"] * 4 + ["L4-24GB"] * 2
    assert a[0].memory_mb == 40 * 1024
    assert [g.uuid for g in a] == [g.uuid for g in again]
    assert not {g.uuid for g in a} & {g.uuid for g in other}
    assert len({g.uuid for g in a}) == 6


def _group(argv):
    return subprocess.Popen(argv, start_new_session=True)


def test_simulated_utilization_follows_the_jobs_cpu_use():
    backend = SimulatedBackend("3xH100-80GB", "node-a")
    busy = _group([sys.executable, "-c", "while True: pass"])
    idle = _group(["sleep", "60"])
    try:
        holders = {0: busy.pid, 1: idle.pid}
        backend.sample(holders)
        # A whole core on an idle machine; under load, wait for one clear sample.
        for _ in range(20):
            time.sleep(0.3)
            by_index = {s.index: s for s in backend.sample(holders)}
            assert by_index[1].utilization < 2
            assert by_index[2].utilization == 0
            if by_index[0].utilization > 30:
                break
        else:
            raise AssertionError(f"busy job never looked busy: {by_index[0]}")
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    assert by_index[0].processes[0]["pid"] == busy.pid
    assert [p["pid"] for p in by_index[1].processes] == [idle.pid]
    assert by_index[2].processes == []
    assert 0 < by_index[0].memory_used_mb <= 80 * 1024
    assert by_index[0].temperature_c > by_index[1].temperature_c
    assert by_index[0].power_w > by_index[1].power_w
