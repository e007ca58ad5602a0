import logging

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate

log = logging.getLogger(__name__)


def _ensure_append_only_guard(sender, using, **kwargs) -> None:
    """Put the guard's triggers back if a migration rebuilt the table (SQLite drops them)."""
    from .db import append_only_guard_ensure

    append_only_guard_ensure(connections[using])


def _anchor_new_log(sender, using, **kwargs) -> None:
    """A log that never held an event is anchored at its start, so that a missing anchor
    is reported from the first event on (see audit.anchor)."""
    from django.db import DEFAULT_DB_ALIAS

    from .db import _table_exists
    from .services import audit_anchor_new_log

    if using != DEFAULT_DB_ALIAS or not _table_exists(connections[using]):
        return
    try:
        audit_anchor_new_log()
    except OSError as exc:
        log.warning("audit anchor not written after migrate: %s", exc)


class AuditConfig(AppConfig):
    name = "audit"
    label = "audit"
    verbose_name = "Audit log"

    def ready(self) -> None:
        post_migrate.connect(_ensure_append_only_guard, sender=self)
        post_migrate.connect(_anchor_new_log, sender=self)
