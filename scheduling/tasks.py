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


def _takes_waiting(task) -> bool:
    """Whether ``task`` runs in a worker that received it from the reports queue: then it
    also takes the report messages waiting behind it (scheduling.services.reports_queue).
    Eager tasks and direct calls take nothing."""
    from scheduling.agent.protocol import REPORTS_QUEUE

    request = task.request
    info = request.delivery_info or {}
    return not request.is_eager and info.get("routing_key") == REPORTS_QUEUE


@shared_task(name="scheduling.agent_report", ignore_result=True, bind=True)
def agent_report(self, report: dict) -> dict:
    """One report from a node agent that does not batch (see scheduling.agent.protocol),
    with the report messages waiting behind it."""
    from .services.reports_queue import reports_receive

    return reports_receive(report=report, take=_takes_waiting(self))


@shared_task(name="scheduling.agent_reports", ignore_result=True, bind=True)
def agent_reports(self, reports: list) -> dict:
    """A batch of reports from one node agent, in the order it produced them, with the
    report messages waiting behind it."""
    from .services.reports_queue import reports_receive

    return reports_receive(reports=reports, take=_takes_waiting(self))


@shared_task(name="scheduling.heartbeats_drain", ignore_result=True)
def heartbeats_drain() -> dict:
    """Apply every heartbeat waiting on the heartbeats queue, in batches (periodic)."""
    from .services.heartbeats import heartbeats_drain as drain

    return drain()


@shared_task(name="scheduling.reports_probe", ignore_result=True, bind=True)
def reports_probe(self, sent_at: float) -> dict:
    """The reports queue is flowing: everything queued before ``sent_at`` was handled (and
    the report messages waiting behind the probe are applied with it)."""
    from .services.reports_queue import reports_receive

    return reports_receive(probe=sent_at, take=_takes_waiting(self))


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
