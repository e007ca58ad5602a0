from rest_framework.routers import SimpleRouter


class OptionalSlashRouter(SimpleRouter):
    """Routes answer with and without a trailing slash (``/api/v1/jobs`` and ``/api/v1/jobs/``)."""

    def __init__(self) -> None:
        super().__init__()
        self.trailing_slash = "/?"
