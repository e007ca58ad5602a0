"""Command line of the node agent: ``python -m scheduling.agent --node NAME ...``.

``manage.py agent`` calls :func:`main` with the same arguments. Examples::

    python -m scheduling.agent --node gpu-01 --pool training          # NVML, broker from env
    python -m scheduling.agent --node sim-01 --simulate 4xA100-40GB,2xL4-24GB
    python -m scheduling.agent --node sim-01 --simulate 8xH100-80GB --once
    python -m scheduling.agent --discover                               # print GPUs as JSON
    python -m scheduling.agent --node sn1 --observe-only                # a Slurm node's sampler
    sudo python -m scheduling.agent --node gpu-01 --create-accounts --allowed-root '/data/{tenant}'
    sudo python -m scheduling.agent check-isolation --out /tmp/isolation  # see isolation_check

Run as root, the agent starts every job as its own unprivileged account (``run_as`` of the
launch; ``--create-accounts`` makes missing ones with ``useradd --system``), in a 0700
workspace, in a cgroup v2 with the job's limits where the node has one. Not root, it runs
jobs as itself and says so. Either way it logs at start what it enforces and what not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from scheduling.agent.agent import Agent, AgentConfig, AgentStartError
from scheduling.agent.gpus import select_backend
from scheduling.agent.ledger import LEDGER_ENV, ledger_from_env
from scheduling.agent.protocol import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_LOG_CAP_BYTES,
    DEFAULT_RETENTION_DAYS,
    HEARTBEATS_QUEUE,
    REPORTS_QUEUE,
    ProtocolError,
    validate_node_name,
)
from scheduling.agent.runner import SYSTEM_JOB_PATH
from scheduling.agent.serving import DEFAULT_SCRAPE_SECONDS, DEFAULT_SERVE_PORTS, parse_port_range
from scheduling.agent.workdir import FALLBACK_WORK_ROOT
from scheduling.executors.base import TOPOLOGY_LABEL

logger = logging.getLogger("scheduling.agent")

#: Subcommands, given as the first argument; without one the agent runs.
SUBCOMMANDS = {
    "check-isolation": "as root: start an agent and check that its jobs are isolated "
    "(scheduling.agent.isolation_check)",
}

ONCE_DELIVERY_ATTEMPTS = 3


def node_label(text: str) -> tuple[str, str]:
    """``--label KEY=VALUE`` (both non-empty)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


def node_labels(args: argparse.Namespace) -> dict[str, str]:
    """The labels the node reports: ``--label`` ones, then ``--topology``."""
    labels = dict(args.label)
    if args.topology:
        labels[TOPOLOGY_LABEL] = args.topology.strip()
    return labels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice-agent",
        description="Sluice node agent: reports this node's GPUs, runs and stops jobs.",
        epilog="subcommands (first argument): "
        + "; ".join(f"{name}: {what}" for name, what in SUBCOMMANDS.items())
        + ". `sluice-agent SUBCOMMAND --help` says more.",
    )
    parser.add_argument("--node", help="node name (its queue is node.<name>); required")
    parser.add_argument("--pool", help="resource pool this node belongs to")
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        type=node_label,
        metavar="KEY=VALUE",
        help="a label the node reports at registration (repeatable)",
    )
    parser.add_argument(
        "--topology",
        metavar="BLOCK",
        help=f"the node's topology block (switch, rack or NVLink domain): the label "
        f"{TOPOLOGY_LABEL}=BLOCK",
    )
    parser.add_argument(
        "--broker", help="broker URL (default: $CELERY_BROKER_URL, else filesystem://)"
    )
    parser.add_argument(
        "--broker-dir",
        help="folder of the filesystem broker (default: $SLUICE_BROKER_DIR, else var/broker)",
    )
    parser.add_argument(
        "--simulate",
        metavar="SPEC",
        help="simulate GPUs instead of NVML, e.g. 8xH100-80GB or 4xA100-40GB,2xL4-24GB",
    )
    parser.add_argument(
        "--work-dir",
        help="job directories (default: var/agent/<node>; for a root agent whose job "
        f"accounts cannot reach that, e.g. in a 0700 home: under {FALLBACK_WORK_ROOT})",
    )
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=DEFAULT_HEARTBEAT_SECONDS,
        metavar="SECONDS",
        help="seconds between heartbeats (default: %(default)s)",
    )
    parser.add_argument(
        "--retention-days",
        type=float,
        default=DEFAULT_RETENTION_DAYS,
        metavar="DAYS",
        help="days an ended job's directory and checkpoints are kept when its launch does "
        "not say (default: %(default)g)",
    )
    parser.add_argument(
        "--reports-queue",
        "--control-queue",  # its name before reports had a queue of their own
        dest="reports_queue",
        default=REPORTS_QUEUE,
        help="queue for reports (default: %(default)s)",
    )
    parser.add_argument(
        "--heartbeats-queue",
        default=HEARTBEATS_QUEUE,
        metavar="QUEUE",
        help="queue for heartbeats, drained in batches by the control side (default: "
        '%(default)s; "": send them with the other reports, for a control side older than '
        "that queue)",
    )
    parser.add_argument(
        "--create-accounts",
        action="store_true",
        help="as root: create a job's missing Unix account (useradd --system, no home, no "
        "login) instead of failing its launch",
    )
    parser.add_argument(
        "--created-ledger",
        metavar="FILE",
        default=ledger_from_env(),
        type=Path,
        help="append the Unix accounts and directories this agent creates on the host to "
        f"FILE, so that they can be removed again (default: ${LEDGER_ENV}, else no record)",
    )
    parser.add_argument(
        "--stop-jobs-on-exit",
        action="store_true",
        help="stop every job (SIGTERM, SIGKILL 2 s later) when the agent stops, instead of "
        "leaving them to the next agent (a demo's agents)",
    )
    parser.add_argument(
        "--allowed-root",
        action="append",
        default=[],
        metavar="DIR",
        help="absolute directory a job's working_dir or checkpoint_dir may point into, "
        "'{tenant}' replaced by the job's tenant (e.g. /data/{tenant}); repeatable. "
        "Anything else stays inside the job's workspace",
    )
    parser.add_argument(
        "--job-path",
        default=None,
        metavar="PATH",
        help="the PATH jobs get (default: the agent's own PATH when jobs run as the agent's "
        f"user, else {SYSTEM_JOB_PATH}: the agent's install is not the jobs' software)",
    )
    parser.add_argument(
        "--log-cap-mb",
        type=float,
        default=DEFAULT_LOG_CAP_BYTES / 2**20,
        metavar="MB",
        help="output shipped per job when its launch does not say (MiB, default: %(default)g)",
    )
    parser.add_argument(
        "--cgroup-root",
        metavar="DIR",
        help="cgroup v2 directory for job cgroups, e.g. a subtree delegated to the agent "
        "(default: the cgroup2 mount, /sys/fs/cgroup)",
    )
    parser.add_argument(
        "--serve-ports",
        default=f"{DEFAULT_SERVE_PORTS[0]}-{DEFAULT_SERVE_PORTS[1]}",
        metavar="LOW-HIGH",
        help="ports serving jobs are given, as PORT (default: %(default)s)",
    )
    parser.add_argument(
        "--serve-scrape",
        type=float,
        default=DEFAULT_SCRAPE_SECONDS,
        metavar="SECONDS",
        help="seconds between scrapes of the serving jobs' health and metrics paths "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--once", action="store_true", help="register, send one heartbeat, then exit"
    )
    parser.add_argument(
        "--observe-only",
        action="store_true",
        help="launch nothing: only report this node's GPU samples, which job holds which GPU "
        "and zombie GPU processes (a node whose jobs Slurm runs; see scheduling.agent.observe)",
    )
    parser.add_argument(
        "--discover", action="store_true", help="print the discovered GPUs as JSON and exit"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING…")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the agent, or the subcommand named first; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "check-isolation":
        from scheduling.agent import isolation_check

        return isolation_check.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level)
    if args.heartbeat <= 0:
        parser.error("--heartbeat must be positive")
    if args.retention_days < 0:
        parser.error("--retention-days must not be negative")
    if args.log_cap_mb <= 0:
        parser.error("--log-cap-mb must be positive")
    if args.serve_scrape <= 0:
        parser.error("--serve-scrape must be positive")
    try:
        args.serve_ports = parse_port_range(args.serve_ports)
    except ValueError as exc:
        parser.error(f"--serve-ports {exc}")
    for root in args.allowed_root:
        if not root.startswith("/") or ".." in root.split("/") or root.rstrip("/") == "":
            parser.error(f"--allowed-root {root!r}: give an absolute directory, not / (no '..')")
    if args.discover:
        return _discover(args)
    if not args.node:
        parser.error("--node is required")
    try:
        validate_node_name(args.node)
    except ProtocolError as exc:
        parser.error(str(exc))
    if args.observe_only:
        return _observe(args)
    return _run(args)


def _observe(args: argparse.Namespace) -> int:
    """The observe-only sampler: reports, reads no control queue (the bridge does)."""
    from scheduling.agent import observe
    from scheduling.agent.transport import CeleryReportSender

    backend = select_backend(node=args.node, simulate=args.simulate)
    sender = CeleryReportSender(args.broker, args.broker_dir, reports_queue=args.reports_queue)
    logger.info(
        "observe-only sampler for node %s: %d %s GPUs, every %g s; %s",
        args.node,
        len(backend.discover()),
        backend.name,
        args.heartbeat,
        observe.OBSERVE_ONLY_MESSAGE,
    )
    try:
        observe.run(
            node=args.node, backend=backend, send=sender, interval=args.heartbeat, once=args.once
        )
    except KeyboardInterrupt:
        pass
    finally:
        sender.close()
        backend.close()
    return 0


def _configure_logging(level: str) -> None:
    # basicConfig does nothing where logging is configured already (manage.py agent).
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(level.upper())


def _discover(args: argparse.Namespace) -> int:
    backend = select_backend(node=args.node or socket.gethostname(), simulate=args.simulate)
    try:
        gpus = backend.discover()
        samples = backend.sample({})
    finally:
        backend.close()
    print(
        json.dumps(
            {
                "backend": backend.name,
                "gpus": [gpu.as_dict() for gpu in gpus],
                "samples": [sample.as_dict() for sample in samples],
            },
            indent=2,
        )
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    # Imported here so that --discover works without a broker library.
    from scheduling.agent.transport import CeleryReportSender, KombuMessageSource

    # What the agent writes is its own (job state, launch messages with the users' secrets);
    # directories jobs must pass through get their modes explicitly.
    os.umask(0o077)
    config = AgentConfig(
        node=args.node,
        pool=args.pool,
        labels=node_labels(args),
        work_dir=Path(args.work_dir or Path("var") / "agent" / args.node),
        # A chosen work dir is never moved; the default one is, where jobs cannot reach it.
        fallback_work_root=None if args.work_dir else FALLBACK_WORK_ROOT,
        created_ledger=args.created_ledger,
        stop_jobs_on_exit=args.stop_jobs_on_exit,
        heartbeat_seconds=args.heartbeat,
        retention_days=args.retention_days,
        create_accounts=args.create_accounts,
        allowed_roots=tuple(args.allowed_root),
        log_cap_bytes=max(1, round(args.log_cap_mb * 2**20)),
        cgroup_root=Path(args.cgroup_root) if args.cgroup_root else None,
        job_path=args.job_path,
        serve_ports=args.serve_ports,
        serve_scrape_seconds=args.serve_scrape,
    )
    backend = select_backend(node=args.node, simulate=args.simulate)
    sender = CeleryReportSender(
        args.broker,
        args.broker_dir,
        reports_queue=args.reports_queue,
        heartbeats_queue=args.heartbeats_queue,
    )
    try:
        if args.once:
            return _run_once(config, backend, sender)
        messages = KombuMessageSource(args.node, args.broker, args.broker_dir)
        agent = Agent(config, backend, sender, messages)
        _install_signal_handlers(agent)
        logger.info(
            "agent for node %s: %d %s GPUs, work dir %s",
            config.node,
            len(agent.gpus),
            backend.name,
            config.work_dir,
        )
        agent.run()
        return 0
    except AgentStartError as exc:
        logger.error("cannot start: %s", exc)
        return 2
    finally:
        sender.close()


def _run_once(config: AgentConfig, backend, sender) -> int:
    agent = Agent(config, backend, sender)
    agent.start()
    for attempt in range(ONCE_DELIVERY_ATTEMPTS):
        if agent.outbox.flush(force=True):
            break
        time.sleep(0.5 * (attempt + 1))
    undelivered = len(agent.outbox)
    agent.close()
    if undelivered:
        logger.error("%d reports could not be delivered", undelivered)
        return 1
    return 0


def _install_signal_handlers(agent: Agent) -> None:
    """SIGTERM and SIGINT end the loop cleanly; jobs keep running and are adopted by the
    next agent (unless --stop-jobs-on-exit)."""
    try:
        signal.signal(signal.SIGTERM, agent.request_stop)
        signal.signal(signal.SIGINT, agent.request_stop)
    except ValueError:  # not the main thread (embedded): the caller stops the agent
        logger.debug("not installing signal handlers outside the main thread")


if __name__ == "__main__":
    sys.exit(main())
