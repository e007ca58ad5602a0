"""``make demo-reset`` (tools/demo_reset.py) removes what the demo's agents created and
nothing else; ``make run``'s checks (tools/preflight.py) say what would stop it, one line
each."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from scheduling.agent import ledger
from scheduling.agent.workdir import fallback_work_dir
from tests.scheduling.agent.helpers import (
    ACCOUNT_A,
    IS_ROOT,
    NOT_ROOT_REASON,
    launch,
    python_job,
)

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
import demo_reset  # noqa: E402
import preflight  # noqa: E402

root_only = pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)


@root_only
def test_demo_reset_removes_the_accounts_and_folders_the_demo_made(make_agent, tmp_path):
    checkout = tmp_path / "home"
    checkout.mkdir(mode=0o700)
    checkout.chmod(0o700)
    var = checkout / "var"
    var.mkdir()
    created = var / demo_reset.LEDGER_NAME
    fallback_root = tmp_path / "lib" / "sluice"
    tenant_account = f"sluice-r{uuid.uuid4().hex[:8]}"
    h = make_agent(
        work_dir=var / "agent" / "node-a",
        fallback_work_root=fallback_root,
        created_ledger=created,
        create_accounts=True,
    )
    h.send(launch(1, python_job("print('hi')"), run_as=tenant_account))
    # An account that was there before the demo: used, never removed.
    h.send(launch(2, python_job("print('hi')"), run_as=ACCOUNT_A, gpu_indices=[1]))
    assert h.wait_report("exited", 1)["exit_code"] == 0
    assert h.wait_report("exited", 2)["exit_code"] == 0
    moved = fallback_work_dir(var / "agent" / "node-a", fallback_root)
    assert pwd.getpwnam(tenant_account) and moved.is_dir()
    h.agent.close()

    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "demo_reset.py"), "--var-dir", str(var)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"removed the accounts {tenant_account}" in result.stdout
    with pytest.raises(KeyError):
        pwd.getpwnam(tenant_account)
    assert not moved.exists() and not fallback_root.exists() and not var.exists()
    assert pwd.getpwnam(ACCOUNT_A)


def test_demo_reset_without_root_says_to_use_sudo_and_keeps_the_record(tmp_path, monkeypatch):
    var = tmp_path / "var"
    var.mkdir()
    ledger.record(var / demo_reset.LEDGER_NAME, ledger.ACCOUNT, name="sluice-nlp", uid=5, gid=5)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    problems = demo_reset.reset(var)
    assert len(problems) == 1 and "sluice-nlp" in problems[0]
    assert "sudo make demo-reset" in problems[0]
    assert (var / demo_reset.LEDGER_NAME).exists()


def test_demo_reset_of_a_demo_that_created_nothing_removes_var(tmp_path):
    var = tmp_path / "var"
    (var / "broker").mkdir(parents=True)
    assert demo_reset.main(["--var-dir", str(var)]) == 0
    assert not var.exists()


def test_preflight_names_a_busy_web_port_in_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        problem = preflight.port_problem(busy.getsockname())
    assert problem and "\n" not in problem and "is in use" in problem


def test_preflight_reads_the_agents_of_the_procfile():
    agents = preflight.agent_options(ROOT / "Procfile")
    assert [a["--node"] for a in agents] == [
        "gpu-train-01",
        "gpu-train-02",
        "gpu-infer-01",
        "gpu-dev-01",
    ]
    assert all(a["--created-ledger"] == "var/created.jsonl" for a in agents)


@root_only
def test_preflight_finds_the_agents_a_folder_they_can_use(tmp_path):
    checkout = tmp_path / "home" / "sluice"
    (checkout / "var").mkdir(parents=True)
    (tmp_path / "home").chmod(0o700)
    agents = [{"--node": "n1", "--created-ledger": "var/created.jsonl"}]
    fallback_root = tmp_path / "lib"
    assert preflight.agent_problems(agents, root=checkout, fallback_root=fallback_root) == []
    assert fallback_work_dir((checkout / "var/agent/n1").resolve(), fallback_root).is_dir()
    # A chosen work dir is not moved: the one line says what to do.
    chosen = [{"--node": "n1", "--work-dir": "var/agent/n1"}]
    (problem,) = preflight.agent_problems(chosen, root=checkout, fallback_root=fallback_root)
    assert problem.startswith("agent n1: job accounts cannot reach the work dir")
    assert f"chmod o+x {tmp_path / 'home'}" in problem


INNER_ACCOUNT_ENV = "SLUICE_TEST_INNER_ACCOUNT"


@pytest.mark.skipif(not os.environ.get(INNER_ACCOUNT_ENV), reason="run by the test below")
def test_inner_run_creates_an_account():
    from scheduling.agent.isolation import create_account
    from scheduling.agent.ledger import ledger_from_env

    create_account(os.environ[INNER_ACCOUNT_ENV], created_ledger=ledger_from_env())
    create_account(ACCOUNT_A, created_ledger=ledger_from_env())  # there before: kept


@root_only
def test_a_test_run_removes_the_accounts_it_created():
    name = f"sluice-t{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k != ledger.LEDGER_ENV}
    env[INNER_ACCOUNT_ENV] = name
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", __file__]
        + ["-k", "test_inner_run_creates_an_account"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "1 passed" in result.stdout, result.stdout[-3000:]
    with pytest.raises(KeyError):
        pwd.getpwnam(name)
    assert pwd.getpwnam(ACCOUNT_A)
