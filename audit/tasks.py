"""Celery tasks of the audit log: thin wrappers around its services."""

from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(
    name="audit.verify", ignore_result=True, acks_late=False, time_limit=3600, soft_time_limit=3500
)
def verify() -> dict:
    """Periodic ``audit_verify``: the outcome goes to the log and to the audit page."""
    from .services import audit_verify

    result = audit_verify()
    if result.ok:
        log.info("audit log verified: %s events", result.checked)
    else:
        log.error("AUDIT LOG VERIFICATION FAILED: %s", "; ".join(result.problems))
    return result.as_dict()
