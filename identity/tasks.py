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


@shared_task(name="identity.ldap_sync", ignore_result=True)
def ldap_sync() -> dict:
    """The LDAP leavers sync (every SLUICE_LDAP_SYNC_SECONDS): disabled or gone users are
    deactivated, their sessions ended and tokens revoked; the others' roles synced."""
    from .ldap import ldap_sync_all

    if not settings.SLUICE_LDAP_ENABLED:
        return {}
    return vars(ldap_sync_all())
