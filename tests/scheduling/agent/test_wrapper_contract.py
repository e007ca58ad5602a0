"""The job wrapper's contract, run against both wrappers side by side: the compiled one
(wrapper.c, what the agent starts when ``make native`` built it) and wrapper.py (the
reference, and the fallback without a C compiler). Same command line, same status line,
same environment and exit files, same exit status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scheduling.agent import runner
from tests.scheduling.agent.helpers import (
    ACCOUNT_A,
    IS_ROOT,
    NOT_ROOT_REASON,
    ensure_test_accounts,
)


def _native() -> list[str]:
    if not os.access(runner.NATIVE_WRAPPER_PATH, os.X_OK):
        if shutil.which("cc") or shutil.which("gcc"):
            pytest.fail(f"{runner.NATIVE_WRAPPER_PATH} was not built: run make native")
        pytest.skip("no C compiler: the agent uses wrapper.py")
    return [str(runner.NATIVE_WRAPPER_PATH)]


@pytest.fixture(params=["native", "python"])
def wrapper(request) -> list[str]:
    if request.param == "native":
        return _native()
    return [sys.executable, "-I", "-S", str(runner.WRAPPER_PATH)]


class Run:
    """One wrapper run in ``tmp``: its status line, exit file and exit status."""

    def __init__(self, wrapper: list[str], tmp: Path, command: list[str], *, env=None, **opts):
        self.exit_file = tmp / "exit.json"
        self.env_file = tmp / "env"
        runner.write_env_file(self.env_file, {"PATH": os.environ["PATH"], **(env or {})})
        read_fd, write_fd = os.pipe()
        args = [*wrapper, "--exit-file", str(self.exit_file), "--env-file", str(self.env_file)]
        for name, value in opts.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        self.log = tmp / "out.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [*args, "--status-fd", str(write_fd), "--", *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,
                cwd=tmp,
            )
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as status:
            self.status = status.readline().decode().strip()

    def wait(self) -> int:
        return self.process.wait(timeout=30)

    @property
    def exit_info(self) -> dict:
        return json.loads(self.exit_file.read_text())

    @property
    def output(self) -> str:
        return self.log.read_text()


def test_the_command_runs_with_its_environment_and_directory(wrapper, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    run = Run(
        wrapper,
        tmp_path,
        ["sh", "-c", 'echo "$GREETING|$(pwd)|$(umask)"; exit 3'],
        env={"GREETING": "hello = world"},
        cwd=work,
    )
    assert run.status.startswith("ok ")
    assert int(run.status.split()[1]) != run.process.pid  # the command, a child
    assert run.wait() == 3
    assert run.output == f"hello = world|{work}|0077\n"
    assert not run.env_file.exists()  # the job's secrets do not stay on disk
    info = run.exit_info
    assert info["exit_code"] == 3 and info["signal"] is None
    assert abs(info["finished_at"] - time.time()) < 30
    assert oct(run.exit_file.stat().st_mode & 0o777) == "0o600"


def test_a_command_killed_by_a_signal_is_recorded_as_such(wrapper, tmp_path):
    run = Run(wrapper, tmp_path, ["sh", "-c", "kill -9 $$"])
    assert run.status.startswith("ok ")
    assert run.wait() == 128 + 9
    assert run.exit_info["exit_code"] is None and run.exit_info["signal"] == 9


def test_the_wrapper_outlives_a_stop_signal_and_records_the_answer(wrapper, tmp_path):
    # The stop signal goes to the whole group; the command decides how to answer it.
    script = "trap 'echo bye; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    run = Run(wrapper, tmp_path, ["sh", "-c", script])
    deadline = time.monotonic() + 10
    while "ready" not in run.output and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(run.process.pid, signal.SIGTERM)
    assert run.wait() == 7
    assert run.exit_info == {**run.exit_info, "exit_code": 7, "signal": None}


@pytest.mark.parametrize(
    ("command", "opts", "words"),
    [
        (["no-such-command-here"], {}, ["no-such-command-here"]),
        (["true"], {"cwd": "/no/such/directory"}, ["/no/such/directory"]),
    ],
    ids=["unknown command", "missing directory"],
)
def test_a_command_that_cannot_start_is_told_and_recorded(wrapper, tmp_path, command, opts, words):
    run = Run(wrapper, tmp_path, command, **opts)
    assert run.wait() == 127
    assert run.status.startswith("error cannot start ")
    info = run.exit_info
    assert info["exit_code"] is None and info["signal"] is None
    for word in [*words, "No such file or directory"]:
        assert word in run.status and word in info["error"]


def test_an_unreadable_environment_file_fails_the_launch(wrapper, tmp_path):
    bad = tmp_path / "bad-env"
    bad.write_bytes(b"NO_EQUALS_SIGN\0")
    read_fd, write_fd = os.pipe()
    process = subprocess.run(
        [
            *wrapper,
            "--exit-file",
            str(tmp_path / "exit.json"),
            "--env-file",
            str(bad),
            "--status-fd",
            str(write_fd),
            "--",
            "true",
        ],
        pass_fds=(write_fd,),
        timeout=30,
    )
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as status:
        line = status.readline().decode()
    assert process.returncode == 127
    assert line.startswith("error cannot read the job's environment")
    assert not bad.exists()


@pytest.mark.parametrize(
    "args",
    [["--exit-file", "x", "--", "true"], ["--bogus", "1", "--", "true"], ["--status-fd", "x"]],
    ids=["missing options", "unknown option", "bad number"],
)
def test_a_wrong_command_line_exits_2(wrapper, args):
    result = subprocess.run([*wrapper, *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("sluice-job-wrapper: ")


def test_the_wrapper_joins_the_cgroup_before_the_command_starts(wrapper, tmp_path):
    cgroup = tmp_path / "job-cg"
    cgroup.mkdir()
    run = Run(wrapper, tmp_path, ["true"], cgroup=cgroup)
    assert run.wait() == 0
    assert (cgroup / "cgroup.procs").read_text() == str(run.process.pid)


@pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)
def test_only_the_command_drops_to_the_job_account(wrapper, tmp_path):
    uid = ensure_test_accounts()[ACCOUNT_A]
    tmp_path.chmod(0o711)
    work = tmp_path / "work"
    work.mkdir()
    os.chown(work, uid, uid)
    run = Run(wrapper, tmp_path, ["sh", "-c", "id -u; id -g; id -G"], cwd=work, uid=uid, gid=uid)
    assert run.wait() == 0
    assert run.output.split() == [str(uid), str(uid), str(uid)]  # no extra groups
    assert run.exit_file.stat().st_uid == 0  # the wrapper kept the agent's rights
