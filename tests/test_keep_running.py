"""The demo's supervision (tools/keep_running.py under honcho): a killed process comes
back while the others keep serving, and Ctrl-C still stops everything."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEEP_RUNNING = ROOT / "tools" / "keep_running.py"
HONCHO = Path(sys.executable).with_name("honcho")

#: Writes its pid to a file named by the first argument, then waits.
RECORDS_PID = (
    "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(600)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not reaped yet) is gone for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _keep(command: list[str]) -> str:
    return "exec " + shlex.join([sys.executable, str(KEEP_RUNNING), "--", *command])


@pytest.mark.skipif(not HONCHO.exists(), reason="honcho is not installed in this environment")
def test_a_killed_process_comes_back_and_ctrl_c_stops_everything(tmp_path):
    port = _free_port()
    pids = tmp_path / "pids"
    procfile = tmp_path / "Procfile"
    procfile.write_text(
        f"web: {_keep([sys.executable, '-m', 'http.server', '--bind', '127.0.0.1', str(port)])}\n"
        f"worker: {_keep([sys.executable, '-c', RECORDS_PID, str(pids)])}\n"
    )
    stack = subprocess.Popen(
        [str(HONCHO), "start", "-f", str(procfile), "-d", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait(lambda: _serves(port))
        first = _wait(lambda: _pids(pids))[0]
        os.kill(first, signal.SIGKILL)
        # The others keep serving meanwhile, and the killed one is started again.
        second = _wait(lambda: _pids(pids)[1:])[0]
        assert second != first and _alive(second)
        assert _serves(port)
        assert stack.poll() is None

        stack.send_signal(signal.SIGINT)  # what Ctrl-C sends honcho
        stack.wait(timeout=20)
        assert not _alive(second)
        assert not _serves(port)
    finally:
        if stack.poll() is None:
            stack.kill()
            stack.wait()
    output = stack.stdout.read()
    assert "keep_running[python" in output and "starting again in 1 s" in output, output
    assert len(_pids(pids)) == 2, output


def test_a_command_that_keeps_failing_is_given_up_in_one_line(tmp_path):
    wrapper = subprocess.Popen(
        [sys.executable, str(KEEP_RUNNING), "--name", "agent", "--max-quick-failures", "2"]
        + ["--", sys.executable, "-c", "import sys; sys.exit(2)"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = _wait(lambda: wrapper.stderr.readline(), timeout=10)
        assert line.startswith("keep_running[agent]: exited with status 2"), line
        line = wrapper.stderr.readline()
        assert line.startswith("keep_running[agent]: giving up: it ended 2 times in a row")
        # It stays (honcho would stop every other process if it ended), until told to stop.
        time.sleep(0.5)
        assert wrapper.poll() is None
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=5) == 0
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_the_demo_runs_every_process_under_the_wrapper():
    lines = [line for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()]
    assert len(lines) >= 4
    for line in lines:
        name, command = line.split(":", 1)
        # exec: honcho's pid is the wrapper's, not a shell's that a SIGTERM ends at once.
        assert command.split()[:4] == ["exec", "python", "tools/keep_running.py", "--name"], line


#: Starts a child in its own process group that writes its pid, then waits.
LEAVES_A_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); time.sleep(600)"
)


def test_what_a_killed_command_left_running_is_ended_before_it_starts_again(tmp_path):
    pids = tmp_path / "pids"
    wrapper = subprocess.Popen(
        [sys.executable, str(KEEP_RUNNING), "--name", "worker", "--"]
        + [sys.executable, "-c", LEAVES_A_CHILD, RECORDS_PID, str(pids)],
        stderr=subprocess.DEVNULL,
    )
    try:
        first_child = _wait(lambda: _pids(pids))[0]
        command = int(Path(f"/proc/{first_child}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(command, signal.SIGKILL)  # a celery worker killed, its pool child left behind
        second_child = _wait(lambda: _pids(pids)[1:])[0]
        assert not _alive(first_child)
        assert _alive(second_child)
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=10) == 0
        _wait(lambda: not _alive(second_child), timeout=5)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_command_never_outlives_its_wrapper_killed_by_sigkill(tmp_path):
    # `pkill -9 -f celery` matches the wrapper too (its command line names the command):
    # the command must not be left running unsupervised, holding honcho's pipe open.
    pids = tmp_path / "pids"
    wrapper = subprocess.Popen(
        [sys.executable, str(KEEP_RUNNING), "--name", "worker", "--"]
        + [sys.executable, "-c", RECORDS_PID, str(pids)],
        stderr=subprocess.DEVNULL,
    )
    command = _wait(lambda: _pids(pids))[0]
    wrapper.kill()
    wrapper.wait()
    _wait(lambda: not _alive(command), timeout=5)
