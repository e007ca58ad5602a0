"""System checks for the credential settings (a bad value fails at start, not at sign-in)."""

from django.conf import settings
from django.core.checks import Error, register


@register()
def credential_settings(app_configs, **kwargs):
    errors = []
    for name in ("SLUICE_LOGIN_FAILURE_LIMIT", "SLUICE_LOGIN_COOLOFF_MINUTES"):
        if getattr(settings, name) < 1:
            errors.append(Error(f"{name} must be at least 1.", id="accounts.E001"))
    if not 1 <= settings.SLUICE_API_TOKEN_DAYS <= settings.SLUICE_API_TOKEN_MAX_DAYS:
        errors.append(
            Error(
                "SLUICE_API_TOKEN_DAYS must be between 1 and SLUICE_API_TOKEN_MAX_DAYS.",
                id="accounts.E002",
            )
        )
    return errors
