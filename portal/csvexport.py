"""What every CSV export shares: cells a spreadsheet cannot run, and a writer that streams.

A spreadsheet runs a cell that starts with one of ``FORMULA_STARTS`` as a formula (OWASP's
list, "CSV injection"): such a cell gets a quote before it. The audit log's export and the
usage report's CSV both write their cells through :func:`spreadsheet_safe`.
"""

from __future__ import annotations

import csv

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def spreadsheet_safe(text: str) -> str:
    """``text`` as a CSV cell: quoted when a spreadsheet would run it as a formula."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class _Echo:
    """A file-like object whose write returns the line, for csv.writer in a stream."""

    def write(self, value: str) -> str:
        return value


def line_writer():
    """A ``csv.writer`` whose ``writerow`` returns the line instead of writing it (a
    streamed response yields the lines one by one)."""
    return csv.writer(_Echo())
