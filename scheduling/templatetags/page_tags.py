"""Small filters of the pages: durations as people type them (``2h30m``)."""

from django import template

from scheduling.forms import format_duration

register = template.Library()


@register.filter
def hms(seconds) -> str:
    """``9000`` → ``2h30m``, ``259200`` → ``3d``; ``—`` for nothing."""
    if seconds is None or seconds == "":
        return "—"
    return format_duration(seconds)
