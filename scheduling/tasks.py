"""Celery tasks: thin wrappers that take plain data, re-check state and call a service."""

from __future__ import annotations

import logging

from celery import shared_task
from django.core.cache import cache

log = logging.getLogger(__name__)


@shared_task(name="scheduling.dispatch", ignore_result=True, acks_late=False)
def dispatch() -> dict:
    """One dispatch cycle. Clears the coalescing flag first so requests made during it queue another."""
    from .services.dispatch import dispatch_cycle
    from .services.enqueue import DISPATCH_REQUESTED_KEY

    cache.delete(DISPATCH_REQUESTED_KEY)
    return dispatch_cycle()


@shared_task(name="scheduling.agent_report", ignore_result=True)
def agent_report(report: dict) -> None:
    """Route one report from a node agent (see scheduling.agent.protocol) to its service."""
    from .services import nodes

    handlers = {
        "register": nodes.node_register,
        "heartbeat": nodes.node_heartbeat,
        "started": nodes.job_started,
        "exited": nodes.job_exited,
        "log": nodes.job_log_append,
    }
    handler = handlers.get(report.get("type"))
    if handler is None:
        log.warning("unknown agent report type %r", report.get("type"))
        return
    handler(report)


@shared_task(name="scheduling.control_sweep", ignore_result=True)
def control_sweep() -> dict:
    """Periodic checks: lost nodes, stuck launches, runtime limits, idle reclaim, expired grants."""
    from .services.sweeps import control_sweep as run

    return run()


@shared_task(
    name="scheduling.simulation_run",
    ignore_result=True,
    acks_late=False,
    time_limit=3600,
    soft_time_limit=3500,
)
def simulation_run(run_id: int) -> None:
    """Run one queued what-if simulation (long: it replays the recorded jobs twice)."""
    from .services.whatif import simulation_run_execute

    simulation_run_execute(run_id=run_id)
