"""The tiny process that runs a job's command and writes down how it ended.

The agent starts every job as ``python -I wrapper.py --exit-file F --status-fd N [--cwd D]
-- argv...`` in a new session, so the wrapper leads the job's process group. The wrapper
starts the command as its child (same group), tells the agent through the status pipe
whether that worked (``ok <pid>`` or ``error <message>``), waits for the command and writes
``{"exit_code", "signal", "finished_at"}`` to the exit file. Because the exit file is on
disk, no exit status is lost when the agent restarts while a job runs: the new agent is not
the job's parent and could not wait for it otherwise.

The wrapper survives the SIGTERM of a stop (the whole group gets it) so that it can record
the command's answer to it; the SIGKILL after the grace period ends it with the rest of the
group, and then the agent records the signal itself. Standard library only, and run with
``-I`` so the job's PYTHONPATH cannot break it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

#: Exit status of the wrapper when the command could not be started (as a shell does).
CANNOT_START = 127


def write_exit_file(path: str, info: dict) -> None:
    """Write ``info`` to ``path`` atomically, so a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _tell_agent(status_fd: int, line: str) -> None:
    try:
        os.write(status_fd, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        os.close(status_fd)
    except OSError:
        pass  # the agent went away; the exit file still records the outcome


def _ignore(signum: int, frame: object) -> None:
    """Outlive the stop signals sent to the group: the command decides how to answer."""


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sluice-job-wrapper")
    parser.add_argument("--exit-file", required=True)
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--cwd", default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the command, report its pid, wait, record how it ended; return its status."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    # A Python handler (unlike SIG_IGN) is reset to the default when the child execs.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    try:
        child = subprocess.Popen(args.command, cwd=args.cwd, close_fds=True)
    except (OSError, ValueError) as exc:
        message = f"cannot start {args.command[0]!r}: {exc}"
        write_exit_file(
            args.exit_file,
            {"exit_code": None, "signal": None, "error": message, "finished_at": time.time()},
        )
        _tell_agent(args.status_fd, f"error {message}")
        return CANNOT_START
    _tell_agent(args.status_fd, f"ok {child.pid}")
    returncode = child.wait()
    exit_code, signum = (None, -returncode) if returncode < 0 else (returncode, None)
    write_exit_file(
        args.exit_file,
        {"exit_code": exit_code, "signal": signum, "finished_at": time.time()},
    )
    return exit_code if exit_code is not None else 128 + signum


if __name__ == "__main__":
    sys.exit(main())
