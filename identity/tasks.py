from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from .services import oidc_stale_sessions_end


@shared_task(name="identity.oidc_sessions_expire", ignore_result=True)
def oidc_sessions_expire() -> int:
    """Sign out OIDC users whose last sign-in is older than SLUICE_OIDC_MAX_SESSION_AGE."""
    return oidc_stale_sessions_end(
        now=timezone.now(), max_age=timedelta(seconds=settings.SLUICE_OIDC_MAX_SESSION_AGE)
    )
