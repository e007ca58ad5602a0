from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate


def _ensure_append_only_guard(sender, using, **kwargs) -> None:
    """Put the guard's triggers back if a migration rebuilt the table (SQLite drops them)."""
    from .db import append_only_guard_ensure

    append_only_guard_ensure(connections[using])


class AuditConfig(AppConfig):
    name = "portal.audit"
    label = "audit"
    verbose_name = "Audit log"

    def ready(self) -> None:
        post_migrate.connect(_ensure_append_only_guard, sender=self)
