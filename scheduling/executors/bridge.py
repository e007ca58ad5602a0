"""A bridge process: one runtime serving every node an executor offers (a Slurm partition,
a Kubernetes cluster), over the node wire protocol, until SIGTERM or SIGINT. No Django."""

from __future__ import annotations

import signal
import sys

from scheduling.executors.base import Executor


def run_bridge(
    executor: Executor, *, pool: str, broker: str, heartbeat: float, no_nodes: str
) -> int:
    """Serve the executor's nodes; 2 with ``no_nodes`` on stderr when it offers none."""
    from scheduling.agent.transport import CeleryReportSender, KombuMessageSource
    from scheduling.executors.runtime import Runtime, RuntimeConfig, RuntimeNode

    names = [node.name for node in executor.nodes()]
    if not names:
        print(no_nodes, file=sys.stderr)
        return 2
    nodes = [
        RuntimeNode(name=name, messages=KombuMessageSource(name, broker), pool=pool)
        for name in names
    ]
    runtime = Runtime(
        executor, nodes, CeleryReportSender(broker), RuntimeConfig(heartbeat_seconds=heartbeat)
    )
    signal.signal(signal.SIGTERM, runtime.request_stop)
    signal.signal(signal.SIGINT, runtime.request_stop)
    runtime.run()
    for node in nodes:
        node.messages.close()
    executor.close()
    return 0
