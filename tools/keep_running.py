"""Run a command and start it again whenever it ends, until told to stop.

``make run`` starts every process of the Procfile through this under honcho:

    worker: exec python tools/keep_running.py --name worker -- celery -A portal worker ...

honcho stops the whole stack as soon as one process ends; with this wrapper between
honcho and each process, a process that crashes (or is killed) is started again after a
short pause and the others never notice. Ctrl-C still stops everything: honcho sends
SIGTERM to each wrapper's process group, the wrapper passes it on to the command's own
process group, waits for the command (SIGKILL after a few seconds)
and exits without restarting it. Whenever the command ends, what it left running in its
process group is killed, so that a restarted worker never runs beside its old children.

A command that keeps failing right after it starts (a configuration problem: a port in
use, an agent that cannot start) is given up after ``--max-quick-failures`` tries in a row,
with one line saying so; the wrapper then waits for the stop, so the rest of the demo stays
up. It also stops the command if honcho itself goes away (the wrapper is re-parented).

Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

#: Pauses before a restart: doubled after each quick failure, up to the last.
BACKOFF_SECONDS = (1.0, 2.0, 4.0, 8.0)
#: A run shorter than this is a quick failure (it counts towards giving up).
QUICK_SECONDS = 10.0
#: Seconds the command has to exit after SIGTERM before it gets SIGKILL: under honcho's
#: own (5 s), after which honcho kills the wrapper and could no longer clean up.
STOP_TIMEOUT = 4.0


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the command, before it runs: SIGTERM when this wrapper dies, even by SIGKILL
    (Linux), so that a killed wrapper never leaves its command running unsupervised,
    holding honcho's output pipe open."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    """Keeps one command running; :meth:`stop` (a signal handler) ends it."""

    def __init__(self, command: list[str], *, name: str, max_quick_failures: int) -> None:
        self.command = command
        self.name = name
        self.max_quick_failures = max_quick_failures
        self.stopping = False
        self.child: subprocess.Popen | None = None
        self.parent = os.getppid()

    def say(self, text: str) -> None:
        print(f"keep_running[{self.name}]: {text}", file=sys.stderr, flush=True)

    def stop(self, signum: int, _frame: object = None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self._signal_group(signal.SIGTERM)

    def _signal_group(self, signum: int) -> None:
        """Signal the command's process group: the command and what it started (gunicorn's
        and celery's workers, celery's beat), which must not outlive it."""
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signum)

    def _orphaned(self) -> bool:
        return os.getppid() != self.parent

    def _wait_child(self) -> int:
        """The command's exit status; SIGTERM to it when a stop came before it was started,
        SIGKILL when it outlives a stop by STOP_TIMEOUT."""
        assert self.child is not None
        stop_seen: float | None = None
        while True:
            try:
                return self.child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if self._orphaned() and not self.stopping:
                    self.say("the process manager went away: stopping")
                    self.stop(signal.SIGTERM)
                if not self.stopping:
                    continue
                if stop_seen is None:
                    stop_seen = time.monotonic()
                    self._signal_group(signal.SIGTERM)
                elif time.monotonic() - stop_seen > STOP_TIMEOUT:
                    self.say(f"still running {STOP_TIMEOUT:g} s after SIGTERM: SIGKILL")
                    self._signal_group(signal.SIGKILL)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.2, deadline - time.monotonic()))
            if self._orphaned():
                self.stopping = True

    def run(self) -> int:
        quick_failures = 0
        status = 0
        while not self.stopping:
            began = time.monotonic()
            try:
                # Its own process group: what it leaves behind when it dies (a celery pool
                # child, the beat) can be found and ended before it starts again.
                self.child = subprocess.Popen(
                    self.command, process_group=0, preexec_fn=_die_with_parent
                )
            except OSError as exc:
                self.say(f"cannot start {self.command[0]}: {exc.strerror or exc}")
                status = 127
            else:
                status = self._wait_child()
                self._signal_group(signal.SIGKILL)
            if self.stopping:
                break
            ran = time.monotonic() - began
            quick_failures = quick_failures + 1 if ran < QUICK_SECONDS else 0
            if quick_failures >= self.max_quick_failures:
                self.say(
                    f"giving up: it ended {quick_failures} times in a row within "
                    f"{QUICK_SECONDS:g} s of starting (last status {status}); the other "
                    "processes keep running (see its output above)"
                )
                while not self.stopping:
                    self._sleep(1.0)
                break
            pause = BACKOFF_SECONDS[min(max(quick_failures - 1, 0), len(BACKOFF_SECONDS) - 1)]
            self.say(
                f"exited with status {status} after {ran:.0f} s; starting again in {pause:g} s"
            )
            self._sleep(pause)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", help="name in its messages (default: the command)")
    parser.add_argument(
        "--max-quick-failures",
        type=int,
        default=5,
        help=f"give up after this many runs in a row shorter than {QUICK_SECONDS:g} s",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    supervisor = Supervisor(
        command,
        name=args.name or os.path.basename(command[0]),
        max_quick_failures=args.max_quick_failures,
    )
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, supervisor.stop)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
