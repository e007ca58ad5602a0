from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "portal.audit"
    label = "audit"
    verbose_name = "Audit log"
