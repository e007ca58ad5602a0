"""Human output: durations as ``2h30m``, times relative to now, aligned tables."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_duration(text: str) -> int:
    """``2h30m``, ``90m``, ``1d12h``, ``45s`` → seconds. A bare number is refused: minutes
    or seconds? (Slurm reads minutes, the API seconds.)"""
    value = text.strip().lower().replace(" ", "")
    match = _DURATION.fullmatch(value)
    if not value or match is None or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration: write e.g. 2h30m, 90m, 1d, 45s")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ValueError(f"{text!r}: a duration must be longer than 0s")
    return total


def fmt_duration(seconds: float | int | None) -> str:
    """Seconds → its largest unit and the next one: ``2h30m``, ``3d4h``, ``1h`` (for 1h0m5s),
    ``45s``, ``0s``."""
    if seconds is None:
        return "-"
    rest = int(round(abs(seconds)))
    if rest == 0:
        return "0s"
    for i, (unit, size) in enumerate(_UNITS):
        if rest >= size:
            out = f"{rest // size}{unit}"
            if i + 1 < len(_UNITS):
                next_unit, next_size = _UNITS[i + 1]
                count = rest % size // next_size
                if count:
                    out += f"{count}{next_unit}"
            return out
    return "0s"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


def fmt_ago(value: str | None, at: datetime | None = None) -> str:
    """``5m ago`` / ``in 1h05m``."""
    moment = parse_time(value)
    if moment is None:
        return "-"
    delta = (moment - (at or now())).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {fmt_duration(delta)}" if delta > 0 else f"{fmt_duration(-delta)} ago"


def fmt_local(value: str | None) -> str:
    """An API time in the local time zone, to the second."""
    moment = parse_time(value)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def fmt_when(value: str | None) -> str:
    """``2026-12-04 19:40:12 (5m ago)``."""
    if not value:
        return "-"
    return f"{fmt_local(value)} ({fmt_ago(value)})"


def clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[str] = ()
) -> str:
    """Columns aligned on the widest cell; headers in capitals; numbers (``right``) to the
    right. No trailing spaces."""
    cells = [[("-" if c is None or c == "" else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(values: Sequence[str]) -> str:
        out = []
        for i, value in enumerate(values):
            pad = widths[i] - len(value)
            last = i == len(values) - 1
            if headers[i] in right:
                out.append(" " * pad + value)
            else:
                out.append(value if last else value + " " * pad)
        return "  ".join(out).rstrip()

    return "\n".join([line([h.upper() for h in headers]), *(line(r) for r in cells)])
