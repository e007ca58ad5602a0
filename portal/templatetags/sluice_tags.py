"""Template helpers shared by every app's pages."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def pct(value) -> int:
    """A percentage as a whole number from 0 to 100, for the ``w-N`` / ``at-N`` classes of
    sluice.css: bars get their widths from classes, not from ``style=`` attributes, which the
    Content-Security-Policy (``style-src 'self'``) refuses."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    if number != number:  # NaN
        return 0
    return int(max(0.0, min(100.0, number)) + 0.5)
