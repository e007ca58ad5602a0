"""The one business-error type: a code, a message and optional field messages.

Services raise it; the API turns it into a 400 (see portal.api.errors) and pages into form
errors. Bad input never becomes a 500.
"""


class BusinessError(Exception):
    """A rule of the business was broken; the message says what to change."""

    status_code = 400

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid",
        field: str | None = None,
        errors: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.errors: dict[str, list[str]] = dict(errors or {})
        if field:
            self.errors.setdefault(field, []).append(message)


class PermissionDeniedError(BusinessError):
    """The user may see the object but may not do this to it (403)."""

    status_code = 403

    def __init__(
        self,
        message: str = "You do not have permission to do this.",
        *,
        code: str = "permission_denied",
        field: str | None = None,
    ) -> None:
        super().__init__(message, code=code, field=field)


class NotFoundError(BusinessError):
    """The object does not exist for this user (404), also when it is another tenant's."""

    status_code = 404

    def __init__(self, message: str = "Not found.") -> None:
        super().__init__(message, code="not_found")
