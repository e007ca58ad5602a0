"""A small client over the Slurm controller's commands, and the parsing of what they print.

Slurm 22.05 (Debian 12) prints JSON from ``sinfo --json``; the jobs are read with
``squeue --Format`` fields (:data:`SQUEUE_FIELDS`), because ``squeue --json`` ignores every
filter and prints every job the controller remembers, about 3 KB each: after a drain of a
thousand jobs, megabytes per look, seconds of CPU under load. A job's GPU indices (only
needed for jobs that are not Sluice's) come from ``scontrol -d show job``. Submission and
signals go through ``sbatch --parsable`` and ``scancel``. The Python bindings on PyPI follow
newer Slurm releases, so the commands are the stable surface. Pure standard library.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

#: What Sluice writes into a job's ``--comment``: ``sluice:<job_id>:<attempt>``.
COMMENT_RE = re.compile(r"^sluice:(\d+):(\d+)$")
#: Slurm job states of a job that has not ended yet.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
    }
)
#: States in which the job's command runs (or ran and is being cleaned up).
STARTED_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "SIGNALING", "STAGE_OUT"})
#: What each end state means, in words, for the job's message (empty: the job's own exit).
END_MESSAGES = {
    "COMPLETED": "",
    "FAILED": "",
    "CANCELLED": "cancelled in Slurm",
    "TIMEOUT": "Slurm's time limit was reached",
    "NODE_FAIL": "the Slurm node failed",
    "OUT_OF_MEMORY": "killed by Slurm: out of memory",
    "PREEMPTED": "preempted by Slurm",
    "BOOT_FAIL": "the Slurm node failed to boot",
    "DEADLINE": "Slurm's deadline was reached",
    "REVOKED": "revoked by Slurm (federation)",
    "SPECIAL_EXIT": "held by Slurm after a special exit",
}


class SlurmError(RuntimeError):
    """A Slurm command failed or printed what could not be read."""


class SlurmJobGone(SlurmError):
    """The controller does not know the job (it ended and was purged, or never was)."""


#: What ``scancel`` says of a job the controller does not know (Slurm's ESLURM_INVALID_JOB_ID).
INVALID_JOB_ID = "Invalid job id"


def sluice_ids(comment: str) -> tuple[int, int] | None:
    """``(job_id, attempt)`` from a Slurm job's comment, or None for a job not Sluice's."""
    match = COMMENT_RE.match((comment or "").strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def decode_wait_status(status: int | None) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` from Slurm's ``exit_code`` (a wait(2) status: the exit code in
    the high byte, a terminating signal in the low seven bits)."""
    if status is None:
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def expand_indices(text: str) -> list[int]:
    """``0-2,5`` → ``[0, 1, 2, 5]``."""
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            indices.extend(range(int(low), int(high) + 1))
        else:
            indices.append(int(part))
    return indices


def expand_hostlist(text: str) -> list[str]:
    """A Slurm host list as node names: ``sn[1-3,7],gpu-a[01-02],head`` → ``sn1 sn2 sn3
    sn7 gpu-a01 gpu-a02 head`` (zero padding kept; one bracket group per name)."""
    names: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?", text):
        prefix, ranges = match.group(1).strip(), match.group(2)
        if ranges is None:
            if prefix:
                names.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.strip().partition("-")
            if not low:
                continue
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{width}d}")
    return names


def parse_topology(text: str) -> dict[str, str]:
    """The topology block of each node from ``scontrol show topology``: with the tree
    plugin, the leaf switch (``Level=0``) a node hangs from; with the block plugin, its
    block (``BlockName=``). Empty without a topology plugin (the command then prints
    nothing, its error says "No topology information available")."""
    blocks: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        name = fields.get("BlockName") or (
            fields.get("SwitchName") if fields.get("Level", "0") == "0" else None
        )
        if not name or not fields.get("Nodes"):
            continue
        for node in expand_hostlist(fields["Nodes"]):
            blocks.setdefault(node, name)
    return blocks


_GRES_RE = re.compile(
    r"^(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?:(?P<count>\d+)(?:\((?P<extra>[^)]*)\))?$"
)


@dataclasses.dataclass(frozen=True)
class Gres:
    """One entry of a Gres string: ``gpu:h100:8`` or ``gpu:h100:2(IDX:0-1)``."""

    name: str
    type: str
    count: int
    indices: tuple[int, ...] = ()


def parse_gres(text: str) -> list[Gres]:
    """Parse a node's ``gres`` / ``gres_used`` or a job's ``gres_detail`` entry. Entries are
    separated by commas outside parentheses; ``(null)`` and empty give nothing."""
    entries, depth, current = [], 0, ""
    for char in text or "":
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    entries.append(current)
    result = []
    for entry in entries:
        entry = entry.strip()
        if not entry or entry == "(null)":
            continue
        match = _GRES_RE.match(entry)
        if not match:
            continue
        extra = match.group("extra") or ""
        indices: tuple[int, ...] = ()
        if extra.startswith("IDX:") and extra[4:] != "N/A":
            indices = tuple(expand_indices(extra[4:]))
        gres_type = match.group("type") or ""
        count = int(match.group("count"))
        result.append(Gres(match.group("name"), gres_type, count, indices))
    return result


@dataclasses.dataclass(frozen=True)
class SlurmNode:
    """A node of the partition as ``sinfo --json`` describes it."""

    name: str
    hostname: str
    state: str
    cpus: int
    memory_mb: int
    partitions: tuple[str, ...]
    gpus: int
    gpu_type: str
    gpus_used: tuple[int, ...]
    reason: str = ""

    @property
    def usable(self) -> bool:
        """False for a node Slurm will not start jobs on (down, drained, failing)."""
        bad = ("down", "drain", "fail", "unknown", "future", "maint", "not_responding")
        return not any(word in self.state.lower() for word in bad)


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """A job of the controller as ``squeue`` describes it."""

    job_id: str
    name: str
    state: str
    partition: str
    user: str
    nodes: str
    comment: str
    exit_status: int | None
    state_reason: str
    gpu_indices: tuple[int, ...]
    gpus_requested: int
    start_time: int
    end_time: int
    standard_output: str
    required_nodes: str = ""

    @property
    def node(self) -> str:
        """The node it runs on, or the one it is pinned to while pending."""
        return self.nodes or self.required_nodes

    @property
    def sluice(self) -> tuple[int, int] | None:
        return sluice_ids(self.comment)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def started(self) -> bool:
        return self.state in STARTED_STATES or (not self.active and self.start_time > 0)


def _load(text: str, what: str) -> Mapping[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"{what} printed what is not JSON: {text[:200]!r}") from exc
    if not isinstance(data, dict):
        raise SlurmError(f"{what} printed {type(data).__name__}, not an object")
    errors = [e for e in data.get("errors") or [] if e]
    if errors:
        raise SlurmError(f"{what}: {errors}")
    return data


def _gpu_gres(entries: Sequence[Gres]) -> list[Gres]:
    return [g for g in entries if g.name == "gpu"]


def parse_sinfo(text: str) -> list[SlurmNode]:
    """The nodes of ``sinfo --json`` (each node once, with its GPU Gres)."""
    nodes = {}
    for item in _load(text, "sinfo --json").get("nodes") or []:
        gres = _gpu_gres(parse_gres(item.get("gres") or ""))
        used = _gpu_gres(parse_gres(item.get("gres_used") or ""))
        state = str(item.get("state") or "")
        flags = item.get("state_flags") or []
        if flags:
            state = "+".join([state, *(str(f) for f in flags)])
        node = SlurmNode(
            name=str(item["name"]),
            hostname=str(item.get("hostname") or item["name"]),
            state=state,
            cpus=int(item.get("cpus") or 0),
            memory_mb=int(item.get("real_memory") or 0),
            partitions=tuple(item.get("partitions") or ()),
            gpus=sum(g.count for g in gres),
            gpu_type=next((g.type for g in gres if g.type), ""),
            gpus_used=tuple(sorted(i for g in used for i in g.indices)),
            reason=str(item.get("reason") or ""),
        )
        nodes[node.name] = node
    return list(nodes.values())


def _gpus_requested(item: Mapping[str, Any]) -> int:
    total = 0
    for field in ("tres_per_node", "tres_per_job"):
        for part in str(item.get(field) or "").split(","):
            # gres:gpu:2, gres:gpu:h100:2, gpu:2
            pieces = part.split(":")
            if "gpu" in pieces and pieces[-1].isdigit():
                total += int(pieces[-1])
    return total


#: The ``squeue --Format`` fields read, in order, each followed by :data:`FIELD_END`.
SQUEUE_FIELDS = (
    "JobID",
    "State",
    "Partition",
    "UserName",
    "NodeList",
    "Comment",
    "exit_code",
    "Reason",
    "tres-per-node",
    "tres-per-job",
    "StartTime",
    "EndTime",
    "STDOUT",
    "ReqNodes",
    "Name",
)
#: Ends each field (the unit separator: not in names, comments or paths Slurm accepts).
FIELD_END = "\x1f"
#: What squeue prints for an empty value.
_NONE = ("", "(null)", "N/A", "NONE", "None", "Unknown")
_JOB_GRES_RE = re.compile(r"\bGRES=(\S+)")


def squeue_format() -> str:
    """The ``--Format`` argument: every field, unbounded, ended by :data:`FIELD_END`."""
    return ",".join(f"{name}:{FIELD_END}" for name in SQUEUE_FIELDS)


def _epoch(text: str) -> int:
    """Slurm's local ``YYYY-MM-DDTHH:MM:SS`` as a unix time (0 for none)."""
    if text in _NONE:
        return 0
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0


def _value(text: str) -> str:
    return "" if text in _NONE else text


def parse_squeue(text: str) -> list[SlurmJob]:
    """The jobs of ``squeue --noheader --Format=<squeue_format()>`` (running, pending and
    recently ended ones)."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split(FIELD_END)
        if len(values) < len(SQUEUE_FIELDS):
            raise SlurmError(f"squeue printed a line of {len(values)} fields: {line[:200]!r}")
        item = dict(zip(SQUEUE_FIELDS, (v.strip() for v in values), strict=False))
        exit_status = item["exit_code"]
        jobs.append(
            SlurmJob(
                job_id=item["JobID"],
                name=_value(item["Name"]),
                state=item["State"],
                partition=item["Partition"],
                user=_value(item["UserName"]),
                nodes=_value(item["NodeList"]),
                comment=_value(item["Comment"]),
                exit_status=int(exit_status) if exit_status.isdigit() else None,
                state_reason=_value(item["Reason"]),
                gpu_indices=(),
                gpus_requested=_gpus_requested(
                    {
                        "tres_per_node": _value(item["tres-per-node"]),
                        "tres_per_job": _value(item["tres-per-job"]),
                    }
                ),
                start_time=_epoch(item["StartTime"]),
                end_time=_epoch(item["EndTime"]),
                standard_output=_value(item["STDOUT"]),
                required_nodes=_value(item["ReqNodes"]),
            )
        )
    return jobs


def parse_job_gres_indices(text: str) -> tuple[int, ...]:
    """The GPU indices a running job holds, from ``scontrol -d show job`` (its
    ``GRES=gpu:h100:2(IDX:0-1)`` lines, one per node)."""
    return tuple(
        i
        for match in _JOB_GRES_RE.finditer(text)
        for gres in _gpu_gres(parse_gres(match.group(1)))
        for i in gres.indices
    )


def end_message(job: SlurmJob) -> str:
    """A clear reason for how a Slurm job ended, in words ("" for an ordinary exit)."""
    message = END_MESSAGES.get(job.state, f"ended in Slurm state {job.state}")
    killed = job.exit_status is not None and job.exit_status & 0x7F
    if (
        job.state == "FAILED"
        and not killed
        and job.state_reason not in ("", "None", "NonZeroExitCode")
    ):
        message = f"failed in Slurm ({job.state_reason})"
    return message


class SlurmClient:
    """Runs the controller's commands for one partition; ``conf`` is the slurm.conf to use
    (``SLURM_CONF``; None: Slurm's default)."""

    def __init__(self, *, partition: str, conf: str | None = None, timeout: float = 30.0):
        self.partition = partition
        self.timeout = timeout
        self.env = dict(os.environ)
        #: The GPU indices of running jobs that are not Sluice's, by Slurm job id.
        self._indices: dict[str, tuple[int, ...]] = {}
        if conf:
            self.env["SLURM_CONF"] = conf

    def run(self, args: Sequence[str], *, stdin: str | None = None) -> str:
        try:
            result = subprocess.run(
                list(args),
                input=stdin,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{args[0]}: {exc}") from exc
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise SlurmError(f"{args[0]} failed: {detail[-1] if detail else result.returncode}")
        return result.stdout

    def nodes(self) -> list[SlurmNode]:
        """The partition's nodes."""
        nodes = parse_sinfo(self.run(["sinfo", "--json"]))
        return [n for n in nodes if self.partition in n.partitions]

    def topology(self) -> dict[str, str]:
        """Node name → topology block (leaf switch or block) from ``scontrol show
        topology``; empty when the cluster has no topology plugin."""
        try:
            text = self.run(["scontrol", "show", "topology"])
        except SlurmError as error:
            if "No topology information" in str(error):
                return {}
            raise
        return parse_topology(text)

    def jobs(self) -> list[SlurmJob]:
        """The partition's jobs the controller still knows (ended ones for ``MinJobAge``);
        a running job that is not Sluice's with the GPU indices it holds."""
        out = self.run(
            [
                "squeue",
                "--noheader",
                f"--partition={self.partition}",
                "--states=all",
                f"--Format={squeue_format()}",
            ]
        )
        jobs = [j for j in parse_squeue(out) if j.partition == self.partition]
        outside = {j.job_id for j in jobs if j.sluice is None and j.state == "RUNNING"}
        for gone in set(self._indices) - outside:
            del self._indices[gone]
        return [
            dataclasses.replace(j, gpu_indices=self._gpu_indices(j.job_id))
            if j.job_id in outside
            else j
            for j in jobs
        ]

    def _gpu_indices(self, job_id: str) -> tuple[int, ...]:
        """A running job's GPU indices, asked once per job (they do not change)."""
        if job_id not in self._indices:
            try:
                text = self.run(["scontrol", "--details", "show", "job", job_id])
            except SlurmError:
                return ()  # ended meanwhile, or the controller is away: asked again next time
            self._indices[job_id] = parse_job_gres_indices(text)
        return self._indices[job_id]

    def submit(self, script: str, options: Sequence[str]) -> str:
        """``sbatch --parsable`` the script; the Slurm job id."""
        out = self.run(["sbatch", "--parsable", *options], stdin=script).strip()
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed {out!r}, not a job id")
        return job_id

    def signal(self, job_id: str, signal_name: str) -> None:
        """Send a signal to the batch script and its children (``--full``); raises
        :class:`SlurmJobGone` when the controller does not know the job."""
        self._scancel(["--full", f"--signal={signal_name}", job_id])

    def cancel(self, job_id: str) -> None:
        """Cancel the job; raises :class:`SlurmJobGone` when the controller does not know it."""
        self._scancel([job_id])

    def set_time_limit(self, job_id: str, minutes: int) -> None:
        """Set the job's time limit (raising it needs Slurm's operator rights: the bridge
        runs as root or SlurmUser); raises :class:`SlurmJobGone` when the controller does
        not know the job."""
        try:
            self.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"])
        except SlurmError as exc:
            if INVALID_JOB_ID in str(exc):
                raise SlurmJobGone(str(exc)) from exc
            raise

    def _scancel(self, args: Sequence[str]) -> None:
        try:
            self.run(["scancel", *args])
        except SlurmError as exc:
            if INVALID_JOB_ID in str(exc):
                raise SlurmJobGone(str(exc)) from exc
            raise
