"""What wakes the agent's loop: a message, a job's exit, a launch's answer, a stop request.

The loop sleeps in one ``select`` over a few file descriptors, so that it learns of any of
these the moment it happens and burns no CPU in between:

- a :class:`Wakeup` (a self-pipe) that other threads and signal handlers poke: the message
  source's consumer thread when a message arrives, :meth:`Agent.request_stop`, SIGCHLD;
- one pidfd per job process (``os.pidfd_open``, Linux ≥ 5.3): readable once the process
  has ended, whether the agent started it or adopted it from a previous run (a pidfd works
  for any process, SIGCHLD only for children);
- the status pipe of each job wrapper still starting.

Where pidfds do not exist, SIGCHLD is routed into the wake-up pipe (``signal.set_wakeup_fd``,
main thread only) for the jobs the agent started, and the loop polls every
``poll_seconds`` for the rest. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import signal
import threading
from collections.abc import Hashable

logger = logging.getLogger(__name__)


class Wakeup:
    """A self-pipe: :meth:`set` from any thread (or a signal handler) makes :meth:`fileno`
    readable until :meth:`clear`. Both ends are non-blocking: a full pipe already says
    "wake up", so a failed write loses nothing."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        self._closed = False

    def fileno(self) -> int:
        return self._read

    @property
    def write_fd(self) -> int:
        return self._write

    def set(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write, b"\0")

    def clear(self) -> None:
        """Empty the pipe. Clear first, then look for work: a set in between is kept."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._read)
            os.close(self._write)


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once the process has ended), or None where the kernel
    or Python has none, or the process is gone."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return pidfd_open(pid)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.ENOSYS, errno.EPERM, errno.EINVAL):
            logger.debug("pidfd_open(%s): %s", pid, exc)
        return None


def pidfds_supported() -> bool:
    """True when this kernel gives pidfds (tried on the agent's own process)."""
    fd = open_pidfd(os.getpid())
    if fd is None:
        return False
    os.close(fd)
    return True


class LoopWaiter:
    """The agent's one place to sleep: waits until a watched descriptor is ready, the
    wake-up pipe is poked, or the timeout passes.

    Process watches are one-shot: once a process's pidfd fires it is taken out of the
    selector (the process has ended; the loop's next pass reaps it), so a pass that does
    not finish the job for some reason cannot make the loop spin.
    """

    def __init__(self) -> None:
        self.wakeup = Wakeup()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.wakeup.fileno(), selectors.EVENT_READ, None)
        self._processes: dict[Hashable, int] = {}
        self._readers: dict[int, Hashable] = {}
        self.pidfds = pidfds_supported()
        self.sigchld = False
        self._closed = False

    # --- processes ---

    def watch_process(self, key: Hashable, pid: int) -> bool:
        """Watch ``pid`` until it ends; True when a pidfd does (else the caller polls)."""
        if key in self._processes:
            return True
        fd = open_pidfd(pid) if self.pidfds else None
        if fd is None:
            return False
        self._processes[key] = fd
        self._selector.register(fd, selectors.EVENT_READ, ("process", key))
        return True

    def watching_process(self, key: Hashable) -> bool:
        return key in self._processes

    def forget_process(self, key: Hashable) -> None:
        fd = self._processes.pop(key, None)
        if fd is not None:
            self._unregister(fd)
            os.close(fd)

    def process_keys(self) -> list[Hashable]:
        return list(self._processes)

    # --- other descriptors (job wrappers' status pipes, the message source) ---

    def add_reader(self, fd: int, key: Hashable) -> None:
        if fd not in self._readers:
            self._readers[fd] = key
            self._selector.register(fd, selectors.EVENT_READ, ("reader", key))

    def remove_reader(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            self._unregister(fd)

    # --- SIGCHLD fallback ---

    def route_sigchld(self) -> bool:
        """Where pidfds do not exist: make the exit of a child poke the wake-up pipe. Only
        from the main thread, and only if nothing else in the process uses a wake-up fd
        (it is process-wide). True when installed."""
        if self.sigchld:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            previous = signal.set_wakeup_fd(self.wakeup.write_fd, warn_on_full_buffer=False)
        except ValueError:
            return False
        if previous != -1:  # someone else's (an event loop): leave it theirs
            signal.set_wakeup_fd(previous)
            return False
        # A Python handler is needed for the wake-up fd to be written; it does nothing else.
        signal.signal(signal.SIGCHLD, _on_sigchld)
        self.sigchld = True
        return True

    # --- waiting ---

    def wait(self, timeout: float) -> bool:
        """Sleep until something is ready or ``timeout`` passes; True if woken early."""
        try:
            events = self._selector.select(max(0.0, timeout))
        except InterruptedError:  # pragma: no cover - retried by Python (PEP 475)
            return True
        for key, _ in events:
            if key.data is None:
                self.wakeup.clear()
            elif key.data[0] == "process":
                # One-shot: the process has ended; do not report it again.
                self._unregister(key.fd)
        return bool(events)

    def _unregister(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for key in list(self._processes):
            self.forget_process(key)
        for fd in list(self._readers):
            self.remove_reader(fd)
        if self.sigchld:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.sigchld = False
        self._selector.close()
        self.wakeup.close()


def _on_sigchld(signum: int, frame: object) -> None:
    """Nothing to do: the wake-up fd has been written already."""
