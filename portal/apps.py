from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Sluice portal"

    def ready(self) -> None:
        # Every API serializer refuses unknown fields (portal.api.strict).
        from portal.api import strict

        strict.install()
