"""Small readers of Linux ``/proc``: process identity, process groups, CPU time, memory.

The agent needs these to recognise its own jobs after a restart (a pid plus its start time
names a process uniquely), to find every process of a job's group, and to measure a job's
CPU and memory use for the simulated GPUs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PROC = "/proc"


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the agent uses (times in clock ticks)."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    session: int
    utime: int
    stime: int
    cutime: int
    cstime: int
    start_ticks: int
    rss_pages: int

    @property
    def alive(self) -> bool:
        """False for a process that has exited but was not reaped yet (state Z or X)."""
        return self.state not in ("Z", "X", "x")

    @property
    def cpu_seconds(self) -> float:
        """CPU time of the process and of its reaped children."""
        return (self.utime + self.stime + self.cutime + self.cstime) / CLOCK_TICKS

    @property
    def rss_bytes(self) -> int:
        return self.rss_pages * PAGE_SIZE


def parse_stat(pid: int, text: str) -> ProcStat:
    """Parse the text of ``/proc/<pid>/stat``.

    The command name is in parentheses and may itself contain spaces and parentheses, so
    the fields are split after the last ``)``.
    """
    open_paren, close_paren = text.index("("), text.rindex(")")
    comm = text[open_paren + 1 : close_paren]
    # Fields from 3 (state) on; field N of proc(5) is rest[N - 3].
    rest = text[close_paren + 2 :].split()
    return ProcStat(
        pid=pid,
        comm=comm,
        state=rest[0],
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        session=int(rest[3]),
        utime=int(rest[11]),
        stime=int(rest[12]),
        cutime=int(rest[13]),
        cstime=int(rest[14]),
        start_ticks=int(rest[19]),
        rss_pages=int(rest[21]),
    )


def read_stat(pid: int) -> ProcStat | None:
    """The stat of process ``pid``, or None if there is no such process."""
    try:
        with open(f"{PROC}/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        return parse_stat(pid, text)
    except (ValueError, IndexError):
        return None


def all_pids() -> list[int]:
    """Every pid visible in /proc."""
    try:
        names = os.listdir(PROC)
    except FileNotFoundError:
        return []
    return [int(name) for name in names if name.isdigit()]


def all_stats() -> list[ProcStat]:
    """The stat of every live process (one pass over /proc)."""
    stats = []
    for pid in all_pids():
        stat = read_stat(pid)
        if stat is not None and stat.alive:
            stats.append(stat)
    return stats


def group_members(pgid: int, stats: list[ProcStat] | None = None) -> list[ProcStat]:
    """The live processes of process group ``pgid``."""
    if stats is None:
        stats = all_stats()
    return [s for s in stats if s.pgid == pgid]


def is_same_process(pid: int, start_ticks: int | None) -> bool:
    """True if ``pid`` is alive and is the process that started at ``start_ticks``.

    Pids are reused, so a pid alone does not prove that a process is still ours.
    """
    stat = read_stat(pid)
    if stat is None or not stat.alive:
        return False
    return start_ticks is None or stat.start_ticks == start_ticks


def process_name(pid: int) -> str:
    """A readable name for a process: its command line, else its comm, else ""."""
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        raw = b""
    if raw:
        return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    stat = read_stat(pid)
    return stat.comm if stat else ""


def memory_total_mb() -> int:
    """Total memory of the machine in MiB (0 if unknown)."""
    try:
        with open(f"{PROC}/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
