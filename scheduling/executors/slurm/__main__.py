"""The Slurm bridge: Sluice's runtime serving the nodes of one Slurm partition.

    python -m scheduling.executors.slurm --pool training --partition sluice \\
        --work-dir /shared/sluice --broker redis://...

It discovers the partition's nodes from the controller (``sinfo``), takes each node's
messages from the broker (``node.<name>``) and sends reports back, as an agent does; jobs
become Slurm batch jobs (see :mod:`scheduling.executors.slurm.executor`). Run it as root on
a host with Slurm's client commands and munge (``--uid``/``--gid`` need root), with
``--work-dir`` on a filesystem the nodes share.
"""

from __future__ import annotations

import argparse
import logging
import sys

from scheduling.executors.slurm.client import SlurmClient
from scheduling.executors.slurm.executor import DEFAULT_REFRESH_SECONDS, SlurmExecutor


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scheduling.executors.slurm")
    p.add_argument("--pool", required=True, help="the Sluice pool these nodes belong to")
    p.add_argument("--partition", required=True, help="the Slurm partition Sluice runs")
    p.add_argument("--broker", default=None, help="broker URL (default: CELERY_BROKER_URL)")
    p.add_argument("--slurm-conf", default=None, help="slurm.conf (default: SLURM_CONF)")
    p.add_argument(
        "--work-dir",
        required=True,
        help="the jobs' folders and output files, on a filesystem the nodes share",
    )
    p.add_argument(
        "--pyxis", action="store_true", help="the nodes have pyxis/enroot: run container images"
    )
    p.add_argument(
        "--refresh",
        type=float,
        default=DEFAULT_REFRESH_SECONDS,
        help="seconds between squeue calls",
    )
    p.add_argument("--heartbeat", type=float, default=10.0, help="seconds between heartbeats")
    return p


def build_executor(args: argparse.Namespace) -> SlurmExecutor:
    client = SlurmClient(partition=args.partition, conf=args.slurm_conf)
    return SlurmExecutor(
        client=client, work_dir=args.work_dir, pyxis=args.pyxis, refresh_seconds=args.refresh
    )


def main(argv: list[str] | None = None) -> int:
    from scheduling.executors.bridge import run_bridge

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parser().parse_args(argv)
    return run_bridge(
        build_executor(args),
        pool=args.pool,
        broker=args.broker,
        heartbeat=args.heartbeat,
        no_nodes=f"the Slurm partition {args.partition!r} has no nodes",
    )


if __name__ == "__main__":
    sys.exit(main())
