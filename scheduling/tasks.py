"""Celery tasks: thin wrappers that take plain data, re-check state and call a service."""

from __future__ import annotations

from celery import shared_task
from django.core.cache import cache


@shared_task(name="scheduling.dispatch", ignore_result=True, acks_late=False)
def dispatch() -> dict:
    """One dispatch cycle, paced (``dispatch_pace``). Clears the coalescing flag before the
    cycle so requests made during it queue another."""
    from .services.dispatch import dispatch_cycle, dispatch_pace
    from .services.enqueue import DISPATCH_REQUESTED_KEY

    dispatch_pace()
    cache.delete(DISPATCH_REQUESTED_KEY)
    return dispatch_cycle()


@shared_task(name="scheduling.agent_report", ignore_result=True)
def agent_report(report: dict) -> None:
    """One report from a node agent that does not batch (see scheduling.agent.protocol)."""
    from .services.reports import agent_report_handle

    agent_report_handle(report=report)


@shared_task(name="scheduling.agent_reports", ignore_result=True)
def agent_reports(reports: list) -> dict:
    """A batch of reports from one node agent, in the order it produced them."""
    from .services.reports import agent_reports_process

    return agent_reports_process(reports=reports)


@shared_task(name="scheduling.heartbeats_drain", ignore_result=True)
def heartbeats_drain() -> dict:
    """Apply every heartbeat waiting on the heartbeats queue, in batches (periodic)."""
    from .services.heartbeats import heartbeats_drain as drain

    return drain()


@shared_task(name="scheduling.reports_probe", ignore_result=True)
def reports_probe(sent_at: float) -> None:
    """The reports queue is flowing: everything queued before ``sent_at`` was handled."""
    from .services.nodes import reports_probe_record

    reports_probe_record(sent_at=sent_at)


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
