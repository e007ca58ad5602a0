"""Logging filters."""

import logging


class NoTracebackForExpected403(logging.Filter):
    """A refused page (PermissionDenied → 403) is an expected answer, not a fault: Django
    logs it with the exception's traceback; keep the one-line warning, drop the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) == 403:
            record.exc_info = None
            record.exc_text = None
        return True
