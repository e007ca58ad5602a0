"""Notifications: a line in the portal for each user, and an e-mail when mail is enabled."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from ..models import Job, Notification, PriorityRaise

log = logging.getLogger(__name__)


def _mail(subject: str, body: str, recipients: list[str]) -> None:
    """One message per recipient, so nobody sees the others' addresses."""
    for address in recipients:
        try:
            send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [address])
        except Exception:  # a mail server hiccup must not fail the request that committed
            log.exception("could not mail %s", address)


@transaction.atomic
def notification_send(
    *,
    users: Iterable,
    kind: str,
    message: str,
    link: str = "",
    job: Job | None = None,
    priority_raise: PriorityRaise | None = None,
) -> list[Notification]:
    """Store a notification for each active user; mail them on commit if SLUICE_MAIL_ENABLED."""
    recipients = {u.pk: u for u in users if u is not None and u.is_active}
    now = timezone.now()
    rows = Notification.objects.bulk_create(
        [
            Notification(
                user=user,
                created_at=now,
                kind=kind,
                message=message[:2000],
                link=link,
                job=job,
                priority_raise=priority_raise,
            )
            for user in recipients.values()
        ]
    )
    addresses = [u.email for u in recipients.values() if u.email]
    if settings.SLUICE_MAIL_ENABLED and addresses:
        subject = f"[Sluice] {message[:120]}"
        body = f"{message}\n\n{link}" if link else message
        transaction.on_commit(lambda: _mail(subject, body, addresses))
    return rows


def notification_mark_read(*, user, notification: Notification) -> Notification:
    """Mark one of the user's own notifications read (idempotent)."""
    if notification.read_at is None:
        notification.read_at = timezone.now()
        Notification.objects.filter(pk=notification.pk, user=user, read_at__isnull=True).update(
            read_at=notification.read_at
        )
    return notification


def notifications_mark_all_read(*, user) -> int:
    """Mark every unread notification of the user read; returns how many."""
    return Notification.objects.filter(user=user, read_at__isnull=True).update(
        read_at=timezone.now()
    )
