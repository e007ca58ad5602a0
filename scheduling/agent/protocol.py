"""The wire protocol between the control side (Django, Celery) and the node agents.

Pure standard library: both sides import this module, and GPU nodes have no Django.

Transport
---------
The broker URL comes from ``--broker`` or ``CELERY_BROKER_URL`` (default ``filesystem://``,
the embedded broker that needs no server; its folder comes from ``SLUICE_BROKER_DIR``,
default ``var/broker``). Both sides build their kombu connection with
:func:`scheduling.agent.transport.broker_connection` so that the transport options agree.

Control → agent
~~~~~~~~~~~~~~~
Plain JSON dicts on the kombu queue ``node.<name>`` (``Connection.SimpleQueue(name)``,
serializer ``json``); see :func:`node_queue_name` and
:func:`scheduling.agent.transport.send_control_message`. Four types:

``launch``
    ``job_id`` int, ``attempt`` int, ``name`` str, ``command`` [str, ...] (argv), ``shell``
    bool (true: run ``/bin/sh -c command[0] <name> command[1:]...``), ``env`` {str: str},
    ``working_dir`` str ("" = the job's workspace), ``gpu_indices`` [int], ``gpu_uuids``
    [str] (may be empty; when given they must match the node's GPUs at those indices),
    ``checkpoint_dir`` str ("" = ``workspace/checkpoints``), ``array_index`` int | None,
    ``grace_seconds`` int, ``sent_at`` float (unix time); optional ``retention_days``
    number (how long the node keeps the job's directory, with its checkpoints, after the
    job ended; absent: the agent's ``--retention-days``); optional ``runtime_limit_seconds``
    int | null (positive: how long the job may run as far as the control side knows at
    launch, its runtime limit plus the extensions its policy grants without approval; the
    control side stops it then itself, with its warnings and grace. Executors with a time
    limit of their own set it as a backstop, rounded up and a grace period later: Slurm's
    ``--time``, a Pod's ``activeDeadlineSeconds``. The node agent needs none.)

    Isolation fields, all optional (a message without them is valid and gets the
    defaults): ``tenant`` str (the tenant's slug, "" if unknown; default ""), ``run_as``
    str (the Unix account the job runs as, chosen by the portal; "" = ``sluice-<tenant>``,
    or ``sluice-job`` without a tenant; must match :data:`ACCOUNT_NAME_RE`), ``limits``
    {``cpus`` number | null, ``memory_mb`` int | null, ``pids`` int | null} (null: no
    limit; enforced through the job's cgroup where the node has cgroup v2; default all
    null), ``log_cap_bytes`` int | null (output shipped at most; null = the agent's
    ``--log-cap-mb``, 100 MiB by default).

    Serving, optional: ``serve`` {``health_path`` str, ``metrics_path`` str} (both start
    with "/"; absent or empty: not a serving job). The agent gives a serving job a free TCP
    port of its ``--serve-ports`` range, in the environment as ``PORT`` and
    ``SLUICE_SERVE_PORT`` (over a ``PORT`` of the job's ``env``), and while it runs scrapes
    ``http://127.0.0.1:<port><health_path>`` and ``<metrics_path>`` every
    ``--serve-scrape`` seconds (``serve_metrics`` reports).

    Container, optional: ``image`` str (a reference such as
    ``registry.example.com/team/img:tag`` or ``...@sha256:<digest>``), ``image_pull_policy``
    str (``Always`` | ``IfNotPresent`` | ``Never``, "" = the executor's default),
    ``image_pull_secret`` str (a secret's name, "" = none). Only executors that run images
    get them (Kubernetes, Slurm with pyxis); the node agent fails such a launch
    (``launch_failed``): it runs bare host processes.

    The job runs in its own process group as ``run_as`` (when the agent runs as root; a
    non-root agent runs jobs as itself and says so in ``register``'s ``isolation``). Its
    directory ``<work>/jobs/<job_id>-<attempt>/`` (mode 0711, the agent's) holds the agent's
    files (0600, unreadable to the job) and ``workspace/`` (0700, the job's account), the
    job's cwd and ``HOME``. ``working_dir`` ("" = the workspace) and ``checkpoint_dir`` (""
    = ``workspace/checkpoints``) are relative to the workspace and created there, without
    ``..``; an absolute one must lie under one of the agent's ``--allowed-root``
    directories (``{tenant}`` replaced by the launch's tenant) and exist already. Anything
    else fails the launch (``exited`` / ``launch_failed``, the message names the field).
    The environment is the node's few basics, the message's ``env`` less the reserved
    names (:data:`RESERVED_ENV_NAMES`, :data:`RESERVED_ENV_PREFIXES`: dropped with a
    warning; the portal refuses them at submission), then Sluice's own:
    ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` (the indices; ``none`` for no
    GPU in the latter), ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, ``HOME`` (the workspace), ``USER``
    and ``LOGNAME`` (the account), ``SLUICE_JOB_ID``, ``SLUICE_ATTEMPT``,
    ``SLUICE_JOB_NAME``, ``SLUICE_NODE``, ``SLUICE_CHECKPOINT_DIR``, ``SLUICE_GPU_UUIDS``
    (when given) and ``SLUICE_ARRAY_INDEX`` (when not null); see
    :func:`scheduling.agent.runner.job_environment`. A launch whose GPUs are held by a job
    in its stop grace period (or by an older attempt of the same job, which is stopped
    with reason ``superseded``) starts when that job has ended. A launch of an attempt
    older than one the node has seen is answered ``exited`` / ``superseded``.
``stop``
    ``job_id``, ``attempt``, ``reason`` (one of :data:`STOP_REASONS`), ``grace_seconds``,
    ``sent_at``. SIGTERM to the job's process group, SIGKILL after the grace period; the
    ``exited`` report carries the reason. A stop of an attempt the node does not know is
    answered ``exited`` with ``exit_code`` null and message :data:`NOT_RUNNING_MESSAGE`.
``kill_process``
    ``pid`` int, ``gpu_index`` int, ``reason`` str: SIGKILL a zombie GPU process (only if it
    is still a GPU compute process and belongs to no job of the agent). The outcome is in
    the ``kills`` list of the next heartbeat.
``extend``
    ``job_id``, ``attempt``, ``runtime_limit_seconds`` int (positive: the job's new limit
    as ``launch`` counts it, its extensions within the policy's cap included),
    ``grace_seconds``, ``sent_at``. Sent when an extension is granted to a job that holds
    GPUs. Executors with a time limit of their own raise their backstop to it (Slurm:
    ``scontrol update TimeLimit``); the node agent has none and ignores it, as it does an
    attempt it does not know. An agent older than this message drops it as unknown.

Agent → control
~~~~~~~~~~~~~~~
Celery task messages, in batches: ``send_task(REPORTS_TASK, args=[[report, ...]],
queue=REPORTS_QUEUE)`` (the agent's ``--reports-queue``; ``--control-queue`` is its old
name). One message carries the reports the agent had ready, in the order it made them: at
most 200 reports and about 512 KiB of JSON (a bigger report goes alone); more go as several
messages, in order. The control side handles a batch's reports in order, each as it would
alone. Agents of protocol 1 before batches sent one report per message,
``send_task(REPORT_TASK, args=[report], queue=CONTROL_QUEUE)``; the control side still
accepts those. Heartbeats go apart, as the same task messages (a list of heartbeats) on
the queue ``heartbeats`` (:data:`HEARTBEATS_QUEUE`, the agent's ``--heartbeats-queue``): the
control side drains that queue every second or so and applies the heartbeats of every
message it found together, so a node's heartbeat costs a share of one batch, not a task of
its own; the other reports never wait behind them. An agent started with
``--heartbeats-queue ""`` (and any agent older than this queue) sends its heartbeats with
its other reports, which the control side handles as before. An agent must not be newer
than its control side (as a kubelet must not be newer than its API server): a control side
that does not drain ``heartbeats`` would take its nodes for lost. Every report is a dict
with ``type``, ``node``, ``sent_at`` (unix time) and:

``register`` (once at agent start)
    ``pool`` str | None, ``hostname``, ``agent_version``, ``protocol_version`` int, ``cpus``,
    ``memory_mb``, ``backend`` ("nvml" | "simulated"), ``gpus`` [{index, uuid, model, name,
    memory_mb}], ``jobs`` [as in heartbeat]; optional ``isolation`` (what this node enforces,
    see :func:`scheduling.agent.isolation.isolation_report`): {``run_as_user`` bool (jobs
    run as their own account; false when the agent is not root), ``cgroup`` bool (jobs get
    a cgroup v2 with the limits below), ``cgroup_controllers`` [str] (of cpu, memory, pids),
    ``device_isolation`` bool (always false: GPUs are hidden through
    ``CUDA_VISIBLE_DEVICES`` only), ``proc_hidden`` bool (/proc mounted with hidepid),
    ``notes`` [str] (what is not enforced and why, in words)}; optional ``labels``
    {str: str} (what the node says of itself: topology, rack, partition), kept on the node;
    optional ``executor`` str (the kind of executor serving the node: agent, slurm,
    kubernetes) and ``capabilities`` (what it runs and enforces, as
    :class:`scheduling.executors.base.Capabilities`), shown on the node's pool.
``heartbeat`` (every ``--heartbeat`` seconds)
    ``gpus`` [{index, uuid, utilization (0-100 | None), memory_used_mb, temperature_c,
    power_w, processes: [{pid, memory_mb}]}] (sample values are None where the GPU does
    not report them), ``jobs`` [{job_id, attempt, pid, running, stop_reason}] (the jobs
    the agent holds: running ones, and ones that ended during the last
    :data:`FINISHED_JOB_RETENTION_SECONDS`, with ``running`` false; an ended one also has
    ``exit_code``, ``signal``, ``finished_at`` and ``message``, as its ``exited`` report
    says, so the control side can end a job whose ``exited`` report it lost or has not
    handled yet; agents before this field left them out), ``zombies`` [{gpu_index, pid,
    memory_mb, name}],
    ``kills`` [{pid, gpu_index, killed: bool, message}] (``kill_process`` outcomes since the
    previous heartbeat). A serving job's entry also has ``port`` int (its port).
    Optional ``outside_jobs`` [{``slurm_job_id`` str (a Slurm bridge's) or ``pod`` str
    (``namespace/name``, a Kubernetes bridge's), ``user`` str, ``name`` str,
    ``gpu_indices`` [int], ``gpus`` int, ``label`` str}] (work on the node that is not
    Sluice's and holds its GPUs: jobs of the Slurm partition, Pods asking for the GPU
    resource; the control side counts that many GPUs in use outside Sluice and places
    nothing on them until a heartbeat no longer lists them).
``started``
    ``job_id``, ``attempt``, ``pid`` (the job's process-group leader), ``started_at`` (when
    the wrapper said the command runs; a heartbeat may list the job, running, a moment
    before);
    optional ``isolation``: {``run_as`` str (the account), ``uid`` int, ``gid`` int,
    ``cgroup`` str | null (its cgroup's path), ``limits`` {name: value} (the limits its
    cgroup enforces; empty without one)}; ``port`` int (a serving job: the port it was
    given, also in its environment as ``PORT``).
``exited``
    ``job_id``, ``attempt``, ``exit_code`` int | None, ``signal`` int | None,
    ``stop_reason`` None | a stop reason | ``"launch_failed"`` | ``"superseded"``,
    ``message`` str, ``finished_at``. ``exit_code`` and ``signal`` are both None when the
    process never started or its status could not be known.
``log``
    ``job_id``, ``attempt``, ``offset`` (byte offset of ``data`` in the job's log),
    ``data`` str (UTF-8, invalid bytes replaced; chunks are cut on character boundaries),
    at most :data:`LOG_CHUNK_BYTES` bytes each. Sent every ~2 s while there is new output,
    and all remaining output before the ``exited`` report. A job's output is shipped up to
    its log cap (``log_cap_bytes``): the bytes ``[0, cap)``, then one chunk at offset
    ``cap`` holding :func:`log_truncated_marker`, then nothing more (the job goes on).
``serve_metrics`` (at most one per scrape round, every ``--serve-scrape`` seconds while
serving jobs run)
    ``samples`` [one per serving job scraped in the round: {``job_id`` int, ``attempt``
    int, ``port`` int, ``ready`` bool (the health path answered 2xx in time),
    ``running`` number | null, ``waiting`` number | null (requests in flight and queued),
    ``requests_total`` number | null, ``errors_total`` number | null (cumulative counters,
    as the server exposes them), ``latency_buckets`` [[le seconds, cumulative count],
    ...] in increasing ``le``, the last one's ``le`` null for +Inf (JSON has no infinity;
    the end-to-end request latency histogram; [] when none), ``scraped_at`` number (unix time)}]. The metrics of vLLM (``vllm:*``), TGI
    (``tgi_*``), Triton (``nv_inference_*``) and Sluice's own names (``sluice_*``, see
    :mod:`scheduling.agent.serving`) are normalised into these fields; null: the server
    does not expose it (or its metrics path did not answer).
``samples`` (the observe-only sampler, :mod:`scheduling.agent.observe`, on a node whose
jobs another executor runs; every ``--heartbeat`` seconds)
    ``gpus`` [as in heartbeat, by the node's own GPU indices], ``jobs`` [{``job_id``,
    ``attempt``, ``gpu_indices`` [int]}] (which of the node's GPUs each Sluice job holds, as
    its processes say), ``zombies`` [as in heartbeat]. The control side stores the samples
    on the GPUs Sluice allocated to each job (the executor may have given it other indices)
    and uses them for idle reclaim; it never starts, ends or revives anything on them. A
    bridge's ``heartbeat`` of such a node leaves ``zombies`` out (optional since then).

Delivery is at least once: after an agent restart or a broker outage a report may come
twice, so the control side must treat every report idempotently (``log`` by offset,
``exited`` by a conditional state update). Order is not guaranteed either: the agent sends
a job's reports in order (``started``, ``log``…, ``exited``) and a stopped job's ``exited``
before the ``started`` of the job that waited for its GPUs, in order within a batch and
batch after batch (the filesystem broker keeps the order one process wrote its messages
in). A control worker applies the messages waiting on the reports queue together, in
their order (``scheduling.services.reports_queue``), one process at a time; another
process may meanwhile handle the one message it received, so an ``exited`` may still be
handled before its ``started`` or its last ``log`` chunks when they went in different
messages handled side by side. A heartbeat
on the heartbeats queue may be handled before reports its agent sent earlier; the control
side then repairs from it only what those reports did not do once handled
(``scheduling.services.nodes.heartbeats_apart``). Messages
to the agent are acknowledged only after they have been handled (up to 32 are handed to
the agent's loop at a time), and handling them twice is harmless: a repeated ``launch`` is
answered with ``started`` (running) or ``exited`` (ended), a repeated ``stop`` with nothing
(stopping) or ``exited`` (ended).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from typing import Any

PROTOCOL_VERSION = 1
AGENT_VERSION = "0.1.0"

#: The Celery task the control side registers to receive every report.
REPORT_TASK = "scheduling.agent_report"
#: The Celery task that receives a batch of reports (``args=[[report, ...]]``).
REPORTS_TASK = "scheduling.agent_reports"
#: The Celery queue reports are sent to (a queue of their own, apart from the dispatch loop).
REPORTS_QUEUE = "reports"
#: The queue agents older than the reports queue sent to; the control workers still read it.
CONTROL_QUEUE = "control"
#: The queue heartbeats are sent to, apart from the other reports: the control side takes
#: every waiting message at once (``scheduling.services.heartbeats``) and applies all their
#: nodes' heartbeats together, where a Celery task per message cost more than the heartbeat.
HEARTBEATS_QUEUE = "heartbeats"
NODE_QUEUE_PREFIX = "node."

# Control → agent message types.
LAUNCH = "launch"
STOP = "stop"
KILL_PROCESS = "kill_process"
EXTEND = "extend"
CONTROL_MESSAGE_TYPES = (LAUNCH, STOP, KILL_PROCESS, EXTEND)

# Agent → control report types.
REGISTER = "register"
HEARTBEAT = "heartbeat"
STARTED = "started"
EXITED = "exited"
LOG = "log"
SERVE_METRICS = "serve_metrics"
SAMPLES = "samples"
REPORT_TYPES = (REGISTER, HEARTBEAT, STARTED, EXITED, LOG, SERVE_METRICS, SAMPLES)

# Why a job was stopped (the ``reason`` of a stop message).
STOP_CANCELLED = "cancelled"
STOP_PREEMPTED = "preempted"
STOP_TIMED_OUT = "timed_out"
STOP_RECLAIMED = "reclaimed"
STOP_LOST = "lost"
STOP_REASONS = (STOP_CANCELLED, STOP_PREEMPTED, STOP_TIMED_OUT, STOP_RECLAIMED, STOP_LOST)
# Stop reasons the agent itself puts on an ``exited`` report.
LAUNCH_FAILED = "launch_failed"
#: A newer attempt of the same job was launched on this node, so this one was stopped.
SUPERSEDED = "superseded"
EXIT_STOP_REASONS = (*STOP_REASONS, LAUNCH_FAILED, SUPERSEDED)

NOT_RUNNING_MESSAGE = "not running on this node"

#: Environment names a job may not set: the agent sets them (GPU visibility, identity, the
#: job's home) or they would let the job subvert what it runs (the dynamic loader's
#: hooks). The portal refuses them at submission (400); the agent drops them too.
RESERVED_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "CUDA_DEVICE_ORDER",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
    }
)
RESERVED_ENV_PREFIXES = ("SLUICE_",)

#: Unix account names a job may run as (as ``useradd`` accepts them, without ``$``).
ACCOUNT_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
#: Tenant slugs: they end up in account names and in paths (``--allowed-root /d/{tenant}``).
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
#: Limits a launch may set (``limits``); a job's cgroup enforces them where it can.
LIMIT_NAMES = ("cpus", "memory_mb", "pids")
#: Output shipped per job attempt when the launch does not say (``log_cap_bytes``).
DEFAULT_LOG_CAP_BYTES = 100 * 1024 * 1024
LOG_CHUNK_BYTES = 64 * 1024
LOG_INTERVAL_SECONDS = 2.0
DEFAULT_HEARTBEAT_SECONDS = 5.0
FINISHED_JOB_RETENTION_SECONDS = 300.0
#: Days a node keeps an ended job's directory (its checkpoints) when the launch does not say.
DEFAULT_RETENTION_DAYS = 14.0

# Node names end up in queue names and file names (filesystem broker), so keep them plain.
_NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class ProtocolError(ValueError):
    """A message or report that does not follow the protocol."""


def validate_node_name(node: str) -> str:
    """Return ``node`` if it can name a queue and a directory, else raise ProtocolError."""
    if not isinstance(node, str) or not _NODE_NAME_RE.match(node):
        raise ProtocolError(f"invalid node name {node!r}: use letters, digits, '.', '_', '-'")
    return node


def node_queue_name(node: str) -> str:
    """The queue a node's agent consumes: ``node.<name>``."""
    return NODE_QUEUE_PREFIX + validate_node_name(node)


# --- field checks -------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but True is never a valid job id or pid.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _is_str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


_CHECKS = {
    "int": (_is_int, "an integer"),
    "int?": (lambda v: v is None or _is_int(v), "an integer or null"),
    "number": (_is_number, "a number"),
    "number?": (lambda v: v is None or _is_number(v), "a number or null"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "str?": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "bool": (lambda v: isinstance(v, bool), "a boolean"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "str_list": (_is_str_list, "a list of strings"),
    "int_list": (_is_int_list, "a list of integers"),
    "str_dict": (_is_str_dict, "an object of strings"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
}

_CONTROL_FIELDS: dict[str, dict[str, str]] = {
    LAUNCH: {
        "job_id": "int",
        "attempt": "int",
        "name": "str",
        "command": "str_list",
        "shell": "bool",
        "env": "str_dict",
        "working_dir": "str",
        "gpu_indices": "int_list",
        "gpu_uuids": "str_list",
        "checkpoint_dir": "str",
        "array_index": "int?",
        "grace_seconds": "number",
        "sent_at": "number",
    },
    STOP: {
        "job_id": "int",
        "attempt": "int",
        "reason": "str",
        "grace_seconds": "number",
        "sent_at": "number",
    },
    KILL_PROCESS: {"pid": "int", "gpu_index": "int", "reason": "str"},
    EXTEND: {
        "job_id": "int",
        "attempt": "int",
        "runtime_limit_seconds": "int",
        "grace_seconds": "int",
    },
}

# Fields a message may leave out; checked when present.
_OPTIONAL_CONTROL_FIELDS: dict[str, dict[str, str]] = {
    LAUNCH: {
        "retention_days": "number",
        "runtime_limit_seconds": "int?",
        "tenant": "str",
        "run_as": "str",
        "limits": "dict",
        "log_cap_bytes": "int?",
        "serve": "dict",
        # A container job (executors that run images; the agent refuses none: the control
        # side never places an image on an agent pool).
        "image": "str",
        "image_pull_policy": "str",
        "image_pull_secret": "str",
    },
}

_REPORT_FIELDS: dict[str, dict[str, str]] = {
    REGISTER: {
        "pool": "str?",
        "hostname": "str",
        "agent_version": "str",
        "cpus": "int",
        "memory_mb": "int",
        "backend": "str",
        "gpus": "list",
        "jobs": "list",
    },
    HEARTBEAT: {"gpus": "list", "jobs": "list"},
    STARTED: {"job_id": "int", "attempt": "int", "pid": "int", "started_at": "number"},
    EXITED: {
        "job_id": "int",
        "attempt": "int",
        "exit_code": "int?",
        "signal": "int?",
        "stop_reason": "str?",
        "message": "str",
        "finished_at": "number",
    },
    LOG: {"job_id": "int", "attempt": "int", "offset": "int", "data": "str"},
    SERVE_METRICS: {"samples": "list"},
    SAMPLES: {"gpus": "list", "jobs": "list", "zombies": "list"},
}

# Report fields an older agent leaves out; checked when present.
_OPTIONAL_REPORT_FIELDS: dict[str, dict[str, str]] = {
    REGISTER: {
        "isolation": "dict",
        "labels": "str_dict",
        "executor": "str",
        "capabilities": "dict",
    },
    STARTED: {"isolation": "dict", "port": "int"},
    # A bridge whose nodes have an observe-only sampler leaves zombies to it.
    HEARTBEAT: {"zombies": "list", "outside_jobs": "list"},
}

#: The paths a serving job's ``serve`` names (launch), with their defaults.
SERVE_PATHS = {"health_path": "/health", "metrics_path": "/metrics"}
MAX_SERVE_PATH = 200
#: Fields of one ``serve_metrics`` sample.
_SERVE_SAMPLE_FIELDS = {
    "job_id": "int",
    "attempt": "int",
    "port": "int",
    "ready": "bool",
    "running": "number?",
    "waiting": "number?",
    "requests_total": "number?",
    "errors_total": "number?",
    "latency_buckets": "list",
    "scraped_at": "number",
}

_NODE_ISOLATION_FIELDS = {
    "run_as_user": "bool",
    "cgroup": "bool",
    "cgroup_controllers": "str_list",
    "device_isolation": "bool",
    "notes": "str_list",
}
_JOB_ISOLATION_FIELDS = {
    "run_as": "str",
    "uid": "int",
    "gid": "int",
    "cgroup": "str?",
    "limits": "dict",
}


def _check_fields(message: Mapping[str, Any], fields: Mapping[str, str], what: str) -> None:
    for field, kind in fields.items():
        if field not in message:
            raise ProtocolError(f"{what}: missing field {field!r}")
        check, description = _CHECKS[kind]
        if not check(message[field]):
            raise ProtocolError(f"{what}: {field!r} must be {description}")


def validate_control_message(message: Any) -> dict[str, Any]:
    """Check a control → agent message and return it; raise ProtocolError if invalid.

    Unknown extra fields are allowed (a newer control side may add some).
    """
    if not isinstance(message, dict):
        raise ProtocolError("message must be an object")
    kind = message.get("type")
    if kind not in _CONTROL_FIELDS:
        raise ProtocolError(f"unknown message type {kind!r}")
    _check_fields(message, _CONTROL_FIELDS[kind], kind)
    optional = _OPTIONAL_CONTROL_FIELDS.get(kind, {})
    _check_fields(message, {k: v for k, v in optional.items() if k in message}, kind)
    if kind == LAUNCH:
        if message.get("retention_days", 0) < 0:
            raise ProtocolError("launch: 'retention_days' must not be negative")
        runtime_limit = message.get("runtime_limit_seconds")
        if runtime_limit is not None and runtime_limit <= 0:
            raise ProtocolError("launch: 'runtime_limit_seconds' must be positive or null")
        _check_isolation_fields(message)
        if not message["command"]:
            raise ProtocolError("launch: 'command' must not be empty")
        if message["shell"] and not message["command"][0].strip():
            raise ProtocolError("launch: a shell command must not be blank")
        if message["gpu_uuids"] and len(message["gpu_uuids"]) != len(message["gpu_indices"]):
            raise ProtocolError("launch: 'gpu_uuids' must match 'gpu_indices' one to one")
        _check_serve(message.get("serve") or {})
    if kind == EXTEND and message["runtime_limit_seconds"] <= 0:
        raise ProtocolError("extend: 'runtime_limit_seconds' must be positive")
    if kind == STOP and message["reason"] not in STOP_REASONS:
        raise ProtocolError(f"stop: unknown reason {message['reason']!r}")
    return message


def _check_isolation_fields(message: Mapping[str, Any]) -> None:
    """The launch's isolation fields: names that can become accounts and path parts,
    positive limits. Checked here so that the portal's builder fails loudly, not the node."""
    tenant = message.get("tenant", "")
    if tenant and not TENANT_RE.match(tenant):
        raise ProtocolError(f"launch: 'tenant' {tenant!r} is not a tenant slug")
    run_as = message.get("run_as", "")
    if run_as and not ACCOUNT_NAME_RE.match(run_as):
        raise ProtocolError(f"launch: 'run_as' {run_as!r} is not a Unix account name")
    limits = message.get("limits", {})
    for name in LIMIT_NAMES:
        value = limits.get(name)
        if value is None:
            continue
        valid = _is_number(value) if name == "cpus" else _is_int(value)
        if not valid or value <= 0:
            kind = "a positive number" if name == "cpus" else "a positive integer"
            raise ProtocolError(f"launch: 'limits.{name}' must be {kind} or null")
    cap = message.get("log_cap_bytes")
    if cap is not None and cap <= 0:
        raise ProtocolError("launch: 'log_cap_bytes' must be positive or null")


def _check_serve(serve: Mapping[str, Any]) -> None:
    for key, value in serve.items():
        if key not in SERVE_PATHS:
            raise ProtocolError(f"launch: unknown serve field {key!r}")
        if not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_SERVE_PATH:
            raise ProtocolError(f"launch: 'serve.{key}' must be a path starting with '/'")


def _check_serve_sample(sample: Any) -> None:
    if not isinstance(sample, dict):
        raise ProtocolError("serve_metrics: each sample must be an object")
    _check_fields(sample, _SERVE_SAMPLE_FIELDS, "serve_metrics sample")
    for name in ("running", "waiting", "requests_total", "errors_total", "scraped_at"):
        if sample[name] is not None and not math.isfinite(sample[name]):
            raise ProtocolError(f"serve_metrics: {name!r} must be finite (JSON has no NaN)")
    buckets = sample["latency_buckets"]
    for i, bucket in enumerate(buckets):
        if not (
            isinstance(bucket, list | tuple)
            and len(bucket) == 2
            and (_is_number(bucket[0]) or (bucket[0] is None and i == len(buckets) - 1))
            and _is_number(bucket[1])
            and all(v is None or math.isfinite(v) for v in bucket)
        ):
            raise ProtocolError(
                "serve_metrics: 'latency_buckets' must be [[le, count], ...] "
                "(le null only for the last, +Inf)"
            )


def validate_report(report: Any) -> dict[str, Any]:
    """Check an agent → control report and return it; raise ProtocolError if invalid."""
    if not isinstance(report, dict):
        raise ProtocolError("report must be an object")
    kind = report.get("type")
    if kind not in _REPORT_FIELDS:
        raise ProtocolError(f"unknown report type {kind!r}")
    _check_fields(report, {"node": "str", "sent_at": "number"}, kind)
    _check_fields(report, _REPORT_FIELDS[kind], kind)
    optional = _OPTIONAL_REPORT_FIELDS.get(kind, {})
    _check_fields(report, {k: v for k, v in optional.items() if k in report}, kind)
    if "isolation" in report and kind in (REGISTER, STARTED):
        fields = _NODE_ISOLATION_FIELDS if kind == REGISTER else _JOB_ISOLATION_FIELDS
        _check_fields(report["isolation"], fields, f"{kind} isolation")
    if kind == EXITED and report["stop_reason"] not in (None, *EXIT_STOP_REASONS):
        raise ProtocolError(f"exited: unknown stop_reason {report['stop_reason']!r}")
    if kind == SERVE_METRICS:
        for sample in report["samples"]:
            _check_serve_sample(sample)
    return report


# --- control → agent builders (used by the dispatch loop) ---------------------------------


def launch_message(
    *,
    job_id: int,
    attempt: int,
    name: str,
    command: list[str],
    gpu_indices: list[int],
    gpu_uuids: list[str] | None = None,
    shell: bool = False,
    env: Mapping[str, str] | None = None,
    working_dir: str = "",
    checkpoint_dir: str = "",
    array_index: int | None = None,
    grace_seconds: int = 30,
    retention_days: float | None = None,
    runtime_limit_seconds: int | None = None,
    tenant: str = "",
    run_as: str = "",
    limits: Mapping[str, float | int | None] | None = None,
    log_cap_bytes: int | None = None,
    serve: Mapping[str, str] | None = None,
    image: str = "",
    image_pull_policy: str = "",
    image_pull_secret: str = "",
    sent_at: float | None = None,
) -> dict[str, Any]:
    """Build and validate a ``launch`` message (``retention_days`` and
    ``runtime_limit_seconds`` only when given, ``serve`` only for a serving job, with both paths; the isolation fields always,
    ``limits`` with every name of :data:`LIMIT_NAMES`)."""
    optional: dict[str, Any] = {} if retention_days is None else {"retention_days": retention_days}
    if runtime_limit_seconds is not None:
        optional["runtime_limit_seconds"] = runtime_limit_seconds
    if serve:
        optional["serve"] = {key: serve.get(key, default) for key, default in SERVE_PATHS.items()}
    if image:
        optional.update(
            image=image, image_pull_policy=image_pull_policy, image_pull_secret=image_pull_secret
        )
    limits = dict(limits or {})
    unknown = set(limits) - set(LIMIT_NAMES)
    if unknown:
        raise ProtocolError(f"launch: unknown limits {sorted(unknown)}")
    return validate_control_message(
        {
            "type": LAUNCH,
            "job_id": job_id,
            "attempt": attempt,
            "name": name,
            "command": list(command),
            "shell": shell,
            "env": dict(env or {}),
            "working_dir": working_dir,
            "gpu_indices": list(gpu_indices),
            "gpu_uuids": list(gpu_uuids or []),
            "checkpoint_dir": checkpoint_dir,
            "array_index": array_index,
            "grace_seconds": grace_seconds,
            "tenant": tenant,
            "run_as": run_as,
            "limits": {name: limits.get(name) for name in LIMIT_NAMES},
            "log_cap_bytes": log_cap_bytes,
            "sent_at": time.time() if sent_at is None else sent_at,
            **optional,
        }
    )


def stop_message(
    *, job_id: int, attempt: int, reason: str, grace_seconds: int = 30, sent_at: float | None = None
) -> dict[str, Any]:
    """Build and validate a ``stop`` message."""
    return validate_control_message(
        {
            "type": STOP,
            "job_id": job_id,
            "attempt": attempt,
            "reason": reason,
            "grace_seconds": grace_seconds,
            "sent_at": time.time() if sent_at is None else sent_at,
        }
    )


def extend_message(
    *,
    job_id: int,
    attempt: int,
    runtime_limit_seconds: int,
    grace_seconds: int = 30,
    sent_at: float | None = None,
) -> dict[str, Any]:
    """Build and validate an ``extend`` message."""
    return validate_control_message(
        {
            "type": EXTEND,
            "job_id": job_id,
            "attempt": attempt,
            "runtime_limit_seconds": runtime_limit_seconds,
            "grace_seconds": grace_seconds,
            "sent_at": time.time() if sent_at is None else sent_at,
        }
    )


def kill_process_message(*, pid: int, gpu_index: int, reason: str) -> dict[str, Any]:
    """Build and validate a ``kill_process`` message."""
    return validate_control_message(
        {"type": KILL_PROCESS, "pid": pid, "gpu_index": gpu_index, "reason": reason}
    )


# --- agent → control builders ---------------------------------------------------------------


def report(kind: str, node: str, **fields: Any) -> dict[str, Any]:
    """Build a report of type ``kind`` from ``node``, stamped with the current time."""
    return {"type": kind, "node": node, "sent_at": time.time(), **fields}


def started_report(
    *,
    node: str,
    job_id: int,
    attempt: int,
    pid: int,
    started_at: float,
    isolation: dict[str, Any] | None = None,
    port: int | None = None,
) -> dict:
    """Build a ``started`` report (``isolation`` and a serving job's ``port`` only when
    given)."""
    optional: dict[str, Any] = {} if isolation is None else {"isolation": isolation}
    if port is not None:
        optional["port"] = port
    return report(
        STARTED, node, job_id=job_id, attempt=attempt, pid=pid, started_at=started_at, **optional
    )


def exited_report(
    *,
    node: str,
    job_id: int,
    attempt: int,
    exit_code: int | None,
    signal: int | None,
    stop_reason: str | None,
    message: str,
    finished_at: float,
) -> dict[str, Any]:
    """Build an ``exited`` report."""
    return report(
        EXITED,
        node,
        job_id=job_id,
        attempt=attempt,
        exit_code=exit_code,
        signal=signal,
        stop_reason=stop_reason,
        message=message,
        finished_at=finished_at,
    )


def serve_metrics_report(*, node: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Build and validate a ``serve_metrics`` report (one scrape round's samples)."""
    return validate_report(report(SERVE_METRICS, node, samples=list(samples)))


def log_truncated_marker(cap: int) -> str:
    """The text of the last ``log`` chunk of a job whose output passed its cap."""
    return f"\n[sluice: log truncated at {cap} bytes; the job goes on running]\n"


def is_reserved_env_name(name: str) -> bool:
    """True for an environment name only Sluice may set on the node."""
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def log_report(*, node: str, job_id: int, attempt: int, offset: int, data: str) -> dict:
    """Build a ``log`` report."""
    return report(LOG, node, job_id=job_id, attempt=attempt, offset=offset, data=data)
