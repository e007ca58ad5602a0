from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Sign-in and API credentials: hashed API tokens and the failed sign-in lockout."""

    name = "accounts"
    label = "accounts"
    verbose_name = "Accounts and API tokens"

    def ready(self) -> None:
        from axes.signals import user_locked_out

        from . import checks, schema  # noqa: F401 (registers the system check and the schema extension)
        from .lockout import on_user_locked_out

        user_locked_out.connect(on_user_locked_out, dispatch_uid="sluice-audit-lockout")
