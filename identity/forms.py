from django.conf import settings
from django.core.exceptions import ValidationError

from accounts.forms import LoginForm


class DirectoryAwareLoginForm(LoginForm):
    """The local password form. With ``SLUICE_LOCAL_LOGIN=off`` only platform admins'
    local accounts still sign in here (break-glass, when the provider is down)."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        if not settings.SLUICE_LOCAL_LOGIN and not user.is_staff:
            raise ValidationError(
                "Sign in with the identity provider's button; local passwords are only "
                "for break-glass admin accounts here.",
                code="local_login_off",
            )
