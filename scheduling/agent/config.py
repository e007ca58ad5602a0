"""How one node agent runs (:class:`AgentConfig`, filled by the CLI from its options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scheduling.agent.isolation import MOUNTS_FILE
from scheduling.agent.protocol import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_LOG_CAP_BYTES,
    DEFAULT_RETENTION_DAYS,
    FINISHED_JOB_RETENTION_SECONDS,
    LOG_CHUNK_BYTES,
    LOG_INTERVAL_SECONDS,
)
from scheduling.agent.serving import (
    DEFAULT_SCRAPE_SECONDS,
    DEFAULT_SCRAPE_TIMEOUT,
    DEFAULT_SERVE_PORTS,
)


@dataclass
class AgentConfig:
    """How one agent runs; the CLI fills it from its options."""

    node: str
    work_dir: Path
    pool: str | None = None
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    #: How often the loop looks at running jobs whose exit nothing signals: without pidfds
    #: (Linux < 5.3) the jobs adopted from a previous run (no SIGCHLD for them), or every
    #: job if neither works; and every job with a message source that offers no descriptor
    #: to select on (the loop then waits in the source).
    poll_seconds: float = 0.5
    log_interval_seconds: float = LOG_INTERVAL_SECONDS
    log_chunk_bytes: int = LOG_CHUNK_BYTES
    #: Log chunks one job may queue per pass (bounds memory and keeps passes short).
    log_chunks_per_pass: int = 16
    #: While this many reports wait (broker down), output stays on disk, not in memory.
    log_backlog_limit: int = 256
    launch_timeout_seconds: float = 10.0
    finished_retention_seconds: float = FINISHED_JOB_RETENTION_SECONDS
    #: Finished, reported jobs are forgotten after this long; a duplicate message about
    #: one is then answered as for an unknown job.
    forget_after_seconds: float = 24 * 3600.0
    #: Messages handled per pass at most, so deadlines are enforced even under a flood.
    max_messages_per_pass: int = 100
    #: Seconds a pass spends taking messages at most (at least one is taken): in a burst
    #: of launches, the first jobs' ``started`` (and any exit) go out while the rest are
    #: started, and the next pass goes on without waiting.
    max_receive_seconds: float = 0.1
    #: Reports per broker message at most, and JSON bytes per message at most (a report
    #: bigger than that goes alone).
    max_batch_reports: int = 200
    max_batch_bytes: int = 512 * 1024
    #: An ended job's directory is emptied (all but its state and checkpoints) this long
    #: after its exit was reported.
    workspace_grace_seconds: float = 60.0
    #: Days an ended job's directory, checkpoints included, is kept when its launch does
    #: not say (``retention_days``); then it is removed.
    retention_days: float = DEFAULT_RETENTION_DAYS
    #: How often the job directories are scanned for ones past their retention.
    retention_check_seconds: float = 3600.0
    #: Create a missing job account (``useradd --system``) instead of failing the launch.
    create_accounts: bool = False
    #: Absolute directories a launch's ``working_dir`` / ``checkpoint_dir`` may point into
    #: (``{tenant}`` is replaced by the launch's tenant); anything else stays in the workspace.
    allowed_roots: tuple[str, ...] = ()
    #: Output shipped per job attempt when its launch does not say (``log_cap_bytes``).
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES
    #: cgroup v2 directory under which job cgroups go (None: the cgroup2 mount found).
    cgroup_root: Path | None = None
    #: Where the mounts are read from (cgroup2 and /proc options); tests give their own.
    mounts_file: str = MOUNTS_FILE
    #: The PATH jobs get; None: the agent's own when jobs run as the agent's user, else
    #: SYSTEM_JOB_PATH (the agent's install, a virtual environment under /root say, is
    #: neither the jobs' software nor theirs to reach).
    job_path: str | None = None
    #: Ports serving jobs are given (``PORT``), low and high included.
    serve_ports: tuple[int, int] = DEFAULT_SERVE_PORTS
    #: Seconds between scrapes of the serving jobs' health and metrics (while any runs).
    serve_scrape_seconds: float = DEFAULT_SCRAPE_SECONDS
    #: Seconds each GET of a scrape may take.
    serve_scrape_timeout: float = DEFAULT_SCRAPE_TIMEOUT
    #: Where a root agent makes a work dir the job accounts can reach when ``work_dir`` is
    #: not (a checkout in a 0700 home); None: refuse to start instead (a chosen work dir).
    fallback_work_root: Path | None = None
    #: File the agent appends the accounts and directories it creates on the host to
    #: (see ledger.py), so that they can be removed again; None: no record.
    created_ledger: Path | None = None
    #: Stop every job (SIGTERM, then SIGKILL after ``exit_stop_grace_seconds``) when the
    #: agent stops, instead of leaving them to the next agent: a demo's agents, whose jobs
    #: and serving replicas must not outlive ``make run``.
    stop_jobs_on_exit: bool = False
    exit_stop_grace_seconds: float = 2.0
    #: Labels the node reports at registration (``--label KEY=VALUE``), e.g. its topology
    #: block under ``topology.sluice.io/block`` (``--topology``), which the pool's
    #: ``topology_label`` names; labels an admin set on the node stay.
    labels: dict[str, str] = field(default_factory=dict)


class AgentStartError(RuntimeError):
    """The agent cannot run jobs safely on this node as configured; the message says why."""
