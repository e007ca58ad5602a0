"""Readers of job traces: Microsoft ITP 2021, Alibaba PAI 2023, and Sluice's plain CSV.

Traces are data, read where they lie (``../shared/traces/`` next to the project, or
``SLUICE_TRACES_DIR``); nothing here copies them.

The plain CSV format (one row per job, a header naming the columns; only the first four
are required, the others may be missing or empty)::

    job_id,submit_time,duration,num_gpus,gpus_per_node,tenant,priority_class,gpu_model,workload_type,pool,runtime_limit

``submit_time`` is in seconds (any origin) or an ISO 8601 time; ``duration`` and
``runtime_limit`` in seconds; ``gpu_model`` lists acceptable models separated by ``|``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TextIO

from .model import NodeSpec, Trace, TraceJob

ITP = "itp-2021"
ALIBABA = "alibaba-pai-2023"
CSV_COLUMNS = [
    "job_id",
    "submit_time",
    "duration",
    "num_gpus",
    "gpus_per_node",
    "tenant",
    "priority_class",
    "gpu_model",
    "workload_type",
    "pool",
    "runtime_limit",
]
REQUIRED_COLUMNS = CSV_COLUMNS[:4]
ALIBABA_PODS = {
    "default": "openb_pod_list_default.csv",
    "gpuspec33": "openb_pod_list_gpuspec33.csv",
}
ALIBABA_NODES = "openb_node_list_gpu_node.csv"
# Alibaba's quality of service to a Sluice class: latency-sensitive and guaranteed pods
# are the important ones, best effort the least.
ALIBABA_QOS_CLASS = {"Guaranteed": "high", "LS": "normal", "Burstable": "normal", "BE": "low"}
ALIBABA_POOL = "default"
FRACTIONAL_MODES = ("round-up", "skip")


class TraceError(ValueError):
    """A trace that cannot be read: the message names the file and the row."""


def _number(value: str, where: str, column: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise TraceError(f"{where}: {column} is not a number: {value!r}")


# -- Microsoft ITP 2021 -------------------------------------------------------------------


def itp_cluster_files(directory: Path, cluster: str | None = None) -> list[Path]:
    """The ITP files to read: all ``clusterNN.csv``, or the one named (``cluster04``, ``4``)."""
    files = sorted(directory.glob("cluster*.csv"))
    if not files:
        raise TraceError(f"{directory}: no clusterNN.csv files")
    if cluster is None or cluster in ("", "all"):
        return files
    digits = re.sub(r"\D", "", cluster)
    wanted = f"cluster{int(digits):02d}.csv" if digits else f"{cluster}.csv"
    chosen = [path for path in files if path.name == wanted]
    if not chosen:
        names = ", ".join(path.stem for path in files)
        raise TraceError(f"{directory}: no cluster {cluster!r} (there are {names})")
    return chosen


def read_itp(directory: Path, cluster: str | None = None) -> Trace:
    """ITP jobs, each cluster file as its own pool: the clusters share no GPU and no user,
    so the trace's pools are independent (each gets its own tenants)."""
    jobs: list[TraceJob] = []
    skipped = 0
    files = itp_cluster_files(directory, cluster)
    for path in files:
        pool = path.stem
        with open(path, newline="") as handle:
            for line, row in enumerate(csv.DictReader(handle), 2):
                where = f"{path.name}:{line}"
                duration = _number(row["duration"], where, "duration")
                gpus = int(_number(row["num_gpu"], where, "num_gpu"))
                if duration <= 0 or gpus <= 0:
                    skipped += 1
                    continue
                submit = _number(row["submission_time"], where, "submission_time")
                jobs.append(TraceJob(row["job_id"], submit, duration, gpus, pool=pool))
    name = ITP if len(files) > 1 else f"{ITP}/{files[0].stem}"
    notes = [f"trace: {len(jobs):,} jobs from {len(files)} ITP cluster file(s), one pool each"]
    if skipped:
        notes.append(f"skipped {skipped:,} jobs without a duration or GPUs")
    return Trace(name, jobs, notes=notes, independent_pools=True)


# -- Alibaba PAI 2023 ----------------------------------------------------------------------


def read_alibaba_nodes(directory: Path) -> list[NodeSpec]:
    """The GPU nodes of the openb cluster, in one pool."""
    nodes = []
    with open(directory / ALIBABA_NODES, newline="") as handle:
        for row in csv.DictReader(handle):
            gpus = int(row["gpu"])
            if gpus > 0:
                nodes.append(NodeSpec(row["sn"], ALIBABA_POOL, gpus, row["model"]))
    return nodes


def read_alibaba(directory: Path, pods: str = "default", fractional: str = "round-up") -> Trace:
    """Alibaba PAI pods as jobs, with the trace's node list as the cluster.

    A pod is submitted at ``creation_time`` and runs from ``scheduled_time`` to
    ``deletion_time``. Skipped: pods without GPUs, pods never scheduled (no duration to
    replay). Pods sharing a GPU (``gpu_milli`` < 1000) are rounded up to one whole GPU
    (``fractional="round-up"``: the engine allocates whole GPUs) or skipped (``"skip"``).
    Pods still running at the end of the trace are replayed with their observed time.
    """
    if pods not in ALIBABA_PODS:
        raise TraceError(f"unknown Alibaba pod list {pods!r} (known: {', '.join(ALIBABA_PODS)})")
    if fractional not in FRACTIONAL_MODES:
        raise TraceError(f"fractional must be one of {', '.join(FRACTIONAL_MODES)}")
    path = directory / ALIBABA_PODS[pods]
    jobs: list[TraceJob] = []
    counts = {"cpu": 0, "unscheduled": 0, "fractional": 0, "rounded": 0}
    with open(path, newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), 2):
            job = _alibaba_job(row, f"{path.name}:{line}", fractional, counts)
            if job is not None:
                jobs.append(job)
    notes = [
        f"trace: {len(jobs):,} GPU pods of {path.name}; skipped {counts['cpu']:,} without "
        f"GPUs and {counts['unscheduled']:,} never scheduled",
        f"fractional GPUs (gpu_milli < 1000): {counts['rounded']:,} rounded up to one GPU"
        if fractional == "round-up"
        else f"fractional GPUs (gpu_milli < 1000): {counts['fractional']:,} skipped",
        "classes: from qos (Guaranteed: high, LS and Burstable: normal, BE: low)",
    ]
    return Trace(f"{ALIBABA}/{pods}", jobs, nodes=read_alibaba_nodes(directory), notes=notes)


def _alibaba_job(row: dict, where: str, fractional: str, counts: dict) -> TraceJob | None:
    gpus = int(_number(row["num_gpu"], where, "num_gpu"))
    if gpus <= 0:
        counts["cpu"] += 1
        return None
    if not row["scheduled_time"]:
        counts["unscheduled"] += 1
        return None
    milli = int(_number(row["gpu_milli"] or "1000", where, "gpu_milli"))
    if milli < 1000:
        if fractional == "skip":
            counts["fractional"] += 1
            return None
        counts["rounded"] += 1
    started = _number(row["scheduled_time"], where, "scheduled_time")
    duration = _number(row["deletion_time"], where, "deletion_time") - started
    if duration <= 0:
        counts["unscheduled"] += 1
        return None
    models = tuple(model for model in row["gpu_spec"].split("|") if model)
    return TraceJob(
        job_id=row["name"],
        submit_time=_number(row["creation_time"], where, "creation_time"),
        duration=duration,
        num_gpus=gpus,
        gpus_per_node=gpus,  # a pod runs on one node
        priority_class=ALIBABA_QOS_CLASS.get(row["qos"], ""),
        gpu_models=models,
        pool=ALIBABA_POOL,
    )


# -- Sluice's plain CSV ----------------------------------------------------------------------


def _time(value: str, where: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise TraceError(f"{where}: submit_time is neither seconds nor an ISO time: {value!r}")


def read_csv(path: Path) -> Trace:
    """Jobs of a plain CSV file (see the module docstring for the columns)."""
    with open(path, newline="") as handle:
        jobs = parse_csv(handle, path.name)
    return Trace(path.stem, jobs, notes=[f"trace: {len(jobs):,} jobs from {path.name}"])


def parse_csv(handle: TextIO, name: str = "csv") -> list[TraceJob]:
    """Jobs of a plain CSV stream; raises :class:`TraceError` on a bad row."""
    reader = csv.DictReader(handle)
    missing = [column for column in REQUIRED_COLUMNS if column not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{name}: missing column(s) {', '.join(missing)}")
    jobs = []
    for line, row in enumerate(reader, 2):
        where = f"{name}:{line}"
        gpus = int(_number(row["num_gpus"], where, "num_gpus"))
        duration = _number(row["duration"], where, "duration")
        if gpus <= 0 or duration <= 0:
            raise TraceError(f"{where}: num_gpus and duration must be positive")
        per_node = row.get("gpus_per_node") or ""
        limit = row.get("runtime_limit") or ""
        jobs.append(
            TraceJob(
                job_id=row["job_id"],
                submit_time=_time(row["submit_time"], where),
                duration=duration,
                num_gpus=gpus,
                gpus_per_node=int(_number(per_node, where, "gpus_per_node")) if per_node else None,
                tenant=(row.get("tenant") or "").strip(),
                priority_class=(row.get("priority_class") or "").strip(),
                gpu_models=tuple(m for m in (row.get("gpu_model") or "").split("|") if m),
                workload_type=(row.get("workload_type") or "").strip(),
                pool=(row.get("pool") or "").strip(),
                runtime_limit=_number(limit, where, "runtime_limit") if limit else None,
            )
        )
    return jobs


def write_csv(jobs: Iterable[TraceJob], handle: TextIO) -> int:
    """Write jobs in the plain CSV format; returns how many."""
    writer = csv.writer(handle)
    writer.writerow(CSV_COLUMNS)
    written = 0
    for job in jobs:
        writer.writerow(
            [
                job.job_id,
                f"{job.submit_time:.3f}",
                f"{job.duration:.3f}",
                job.num_gpus,
                job.gpus_per_node or "",
                job.tenant,
                job.priority_class,
                "|".join(job.gpu_models),
                job.workload_type,
                job.pool,
                "" if job.runtime_limit is None else f"{job.runtime_limit:.0f}",
            ]
        )
        written += 1
    return written


# -- by name ----------------------------------------------------------------------------------


def load_trace(
    spec: str,
    traces_dir: Path,
    *,
    cluster: str | None = None,
    alibaba_pods: str = "default",
    fractional: str = "round-up",
) -> Trace:
    """``itp-2021``, ``alibaba-pai-2023`` (under ``traces_dir``) or a path to a CSV file."""
    if spec == ITP:
        return read_itp(traces_dir / ITP, cluster)
    if spec == ALIBABA:
        return read_alibaba(traces_dir / ALIBABA, alibaba_pods, fractional)
    path = Path(spec)
    if not path.is_file():
        raise TraceError(f"no trace {spec!r}: give {ITP}, {ALIBABA} or a CSV file")
    return read_csv(path)
