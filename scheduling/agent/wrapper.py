"""The tiny process that runs a job's command and writes down how it ended.

The compiled twin of this module, ``wrapper.c`` (``make native``), is what the agent runs
when it was built; this one is the reference and the fallback, and both keep the same
contract (tests/scheduling/agent/test_wrapper_contract.py runs them side by side).

The agent starts every job as ``python -I wrapper.py --exit-file F --env-file E --status-fd
N [--cwd D] [--uid U --gid G] [--cgroup C] -- argv...`` in a new session, so the wrapper
leads the job's process group. The wrapper joins the job's cgroup (so that everything the
job starts is inside), reads the job's environment from the env file (and removes it),
starts the command as its child (same group) as the job's account, tells the agent through
the status pipe whether that worked (``ok <pid>`` or ``error <message>``), waits for the
command and writes ``{"exit_code", "signal", "finished_at"}`` to the exit file. Because the
exit file is on disk, no exit status is lost when the agent restarts while a job runs: the
new agent is not the job's parent and could not wait for it otherwise.

The wrapper keeps the agent's rights: it writes the exit file into the agent's directory,
which the job cannot, and a job's processes (another uid) cannot signal or trace it. Only
the command drops to the job's account: uid, gid, no supplementary groups, umask 077.

The wrapper survives the SIGTERM of a stop (the whole group gets it) so that it can record
the command's answer to it; the SIGKILL after the grace period ends it with the rest of the
group, and then the agent records the signal itself. Standard library only, and run with
``-I -S`` so the job's PYTHONPATH cannot break it. It starts for every job, many at once in
a burst of launches, so it imports little (no argparse: a few milliseconds of CPU each).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from subprocess import SubprocessError
from types import SimpleNamespace

#: Exit status of the wrapper when the command could not be started (as a shell does).
CANNOT_START = 127


def write_exit_file(path: str, info: dict) -> None:
    """Write ``info`` to ``path`` atomically, so a reader never sees half a file; the
    file is the agent's alone (0600), as everything in the job's directory."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_env_file(path: str) -> dict[str, str]:
    """The job's environment, written by the agent as ``KEY=VALUE`` entries each ended by
    a NUL byte; removed once read (it holds the user's secrets, and the launch file keeps
    them anyway)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    if data and not data.endswith(b"\0"):
        raise ValueError("the environment file is not a list of NUL-ended KEY=VALUE entries")
    env = {}
    for entry in data.split(b"\0")[:-1]:
        key, sep, value = entry.partition(b"=")
        if not key or not sep:
            raise ValueError("an entry of the environment file is not KEY=VALUE")
        env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def join_cgroup(path: str) -> None:
    """Move the wrapper into the job's cgroup before the command starts, so the command
    and all it starts are inside (children inherit the cgroup)."""
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def _tell_agent(status_fd: int, line: str) -> None:
    try:
        os.write(status_fd, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        os.close(status_fd)
    except OSError:
        pass  # the agent went away; the exit file still records the outcome


def _ignore(signum: int, frame: object) -> None:
    """Outlive the stop signals sent to the group: the command decides how to answer."""


#: The wrapper's options: name → converter. Only the agent calls it, always with ``--``
#: before the command.
_OPTIONS = {
    "--exit-file": str,
    "--status-fd": int,
    "--cwd": str,
    "--env-file": str,
    "--uid": int,
    "--gid": int,
    "--cgroup": str,
}
_REQUIRED = ("--exit-file", "--status-fd", "--env-file")


class UsageError(Exception):
    """The wrapper was called wrongly (exit status 2, as argparse would)."""


def _parse(argv: list[str]) -> SimpleNamespace:
    values: dict[str, object] = {}
    position = 0
    while position < len(argv) and argv[position] != "--":
        name, _, inline = argv[position].partition("=")
        if name not in _OPTIONS:
            raise UsageError(f"unknown option {argv[position]!r}")
        if inline or "=" in argv[position]:
            raw, position = inline, position + 1
        elif position + 1 < len(argv):
            raw, position = argv[position + 1], position + 2
        else:
            raise UsageError(f"{name} needs a value")
        try:
            values[name] = _OPTIONS[name](raw)
        except ValueError:
            raise UsageError(f"{name}: invalid value {raw!r}") from None
    missing = [name for name in _REQUIRED if name not in values]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}")
    command = argv[position + 1 :]
    if not command:
        raise UsageError("no command given")
    return SimpleNamespace(
        command=command, **{name[2:].replace("-", "_"): values.get(name) for name in _OPTIONS}
    )


def _prepare(args: SimpleNamespace) -> tuple[dict[str, str] | None, str]:
    """The job's environment, with the wrapper in the job's cgroup; or None and why not."""
    try:
        env = read_env_file(args.env_file)
    except (OSError, ValueError) as exc:
        return None, f"cannot read the job's environment: {exc}"
    if args.cgroup:
        try:
            join_cgroup(args.cgroup)
        except OSError as exc:
            return None, f"cannot join the job's cgroup {args.cgroup}: {exc}"
    return env, ""


def _start(args: SimpleNamespace, env: dict[str, str]) -> subprocess.Popen:
    account = {}
    if args.uid is not None:
        account = {"user": args.uid, "group": args.gid, "extra_groups": []}
    return subprocess.Popen(
        args.command,
        cwd=args.cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        close_fds=True,
        umask=0o077,
        **account,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command, report its pid, wait, record how it ended; return its status."""
    try:
        args = _parse(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"sluice-job-wrapper: {exc}", file=sys.stderr)
        return 2
    # A Python handler (unlike SIG_IGN) is reset to the default when the child execs.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    env, message = _prepare(args)
    child = None
    if env is not None:
        try:
            child = _start(args, env)
        except (OSError, ValueError, SubprocessError) as exc:
            message = f"cannot start {args.command[0]!r}: {exc}"
    if child is None:
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
    status = main()
    # Gone at once: the agent learns of the exit when this process ends (its pidfd), and
    # the interpreter's own clean-up costs tens of milliseconds for nothing (the exit file
    # is on disk, the status pipe closed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
