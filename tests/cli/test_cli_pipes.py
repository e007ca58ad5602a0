"""`sluice nodes --json | head`: a reader that stops early ends the command quietly, as it
ends `cat` or `grep`, without a BrokenPipeError on stderr.

The installed command runs in a subprocess whose stdout is a pipe closed before it writes
(what `head` does once it has its lines), with Python's own buffering (PYTHONUNBUFFERED
unset): the output then sits in the buffer until the flush at exit, where Python used to
complain and exit 120.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SLUICE = Path(sys.executable).parent / "sluice"


def _closed_reader(argv, env):
    process = subprocess.Popen(
        [SLUICE, *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # the reader is gone before a byte is written
    _, err = process.communicate(timeout=60)
    return process.returncode, err.decode()


@pytest.fixture
def pipe_env(world, cli_env, token_of):
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLUICE_", "DJANGO_", "PYTHONUNBUFFERED"))
    }
    return {**keep, **cli_env, "SLUICE_TOKEN": token_of(world.member)}


@pytest.mark.parametrize(
    "argv", [("nodes", "--json"), ("nodes",), ("queues",), ("--help",), ("show", "--help")]
)
def test_a_reader_that_stops_early_ends_the_command_quietly(pipe_env, argv):
    code, err = _closed_reader(argv, pipe_env)

    assert err == ""
    assert code == 0


def test_errors_still_reach_stderr_when_stdout_is_gone(pipe_env):
    code, err = _closed_reader(("show", "999999"), pipe_env)

    assert code == 3
    assert err == "error: Job not found.\n"
