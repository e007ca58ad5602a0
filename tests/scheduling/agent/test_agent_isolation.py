"""Jobs kept apart on the node: accounts, directories and their modes, paths a launch may
name, and what the agent says it enforces (DESIGN §12)."""

import grp
import json
import os
import pwd
import re
import stat
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from scheduling.agent import isolation
from scheduling.agent.agent import AgentStartError
from scheduling.agent.isolation import (
    JobAccount,
    allowed_roots_for,
    create_account,
    default_account_name,
    job_account,
    make_workspace,
    resolve_job_dir,
    unreachable_parent,
)
from scheduling.agent.protocol import validate_report
from scheduling.agent.runner import SYSTEM_JOB_PATH, LaunchError
from tests.scheduling.agent.helpers import (
    ACCOUNT_A,
    ACCOUNT_B,
    IS_ROOT,
    NOT_ROOT_REASON,
    launch,
    python_job,
    release,
    waiting_job,
)

root_only = pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)

#: Prints who the job runs as and what its umask makes of a new file.
WHO_AM_I = """
import os
print("uid", os.getuid(), os.geteuid())
print("gid", os.getgid(), os.getegid())
print("groups", sorted(os.getgroups()))
print("user", os.environ["USER"], os.environ["LOGNAME"])
print("home", os.environ["HOME"], os.getcwd())
open("made.txt", "w").write("x")
print("mode", oct(os.stat("made.txt").st_mode & 0o777))
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _owner(path: Path) -> str:
    return pwd.getpwuid(os.lstat(path).st_uid).pw_name


def _log_lines(h, job_id: int) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in h.log_text(job_id).splitlines() if " " in line)


# --- accounts ------------------------------------------------------------------------------


@root_only
def test_job_runs_as_its_account_without_groups_and_with_umask_077(make_agent, job_accounts):
    h = make_agent()
    h.send(launch(1, python_job(WHO_AM_I), run_as=ACCOUNT_B))
    started = h.wait_report("started", 1)
    assert h.wait_report("exited", 1)["exit_code"] == 0
    entry = pwd.getpwnam(ACCOUNT_B)
    lines = _log_lines(h, 1)
    assert lines["uid"] == f"{entry.pw_uid} {entry.pw_uid}"
    assert lines["gid"] == f"{entry.pw_gid} {entry.pw_gid}"
    assert lines["groups"] in ("[]", f"[{entry.pw_gid}]")  # no supplementary group (root's)
    assert lines["user"] == f"{ACCOUNT_B} {ACCOUNT_B}"
    workspace = h.workspace(1)
    assert lines["home"] == f"{workspace} {workspace}"
    assert lines["mode"] == "0o600"
    assert validate_report(started)["isolation"] == {
        "run_as": ACCOUNT_B,
        "uid": entry.pw_uid,
        "gid": entry.pw_gid,
        "cgroup": None,
        "limits": {},
    }


@root_only
def test_default_account_comes_from_the_tenant(make_agent):
    h = make_agent()
    # "test-a" → sluice-test-a: the portal's default mapping, when it names no account.
    h.send(launch(2, python_job(WHO_AM_I), run_as="", tenant="test-a"))
    assert h.wait_report("exited", 2)["exit_code"] == 0
    assert _log_lines(h, 2)["user"] == f"{ACCOUNT_A} {ACCOUNT_A}"
    assert default_account_name("") == "sluice-job"


@root_only
def test_a_missing_account_fails_the_launch_unless_the_agent_may_create_it(make_agent):
    name = "sluice-test-new"
    _delete_account(name)
    try:
        h = make_agent()
        h.send(launch(3, ["true"], run_as=name))
        exited = h.wait_report("exited", 3)
        assert exited["stop_reason"] == "launch_failed"
        assert f"run_as: account {name!r} does not exist" in exited["message"]
        assert "--create-accounts" in exited["message"]
        with pytest.raises(KeyError):
            pwd.getpwnam(name)

        creating = make_agent(node="node-b", create_accounts=True)
        creating.send(launch(4, python_job(WHO_AM_I), run_as=name))
        assert creating.wait_report("exited", 4)["exit_code"] == 0
        entry = pwd.getpwnam(name)
        assert entry.pw_uid > 0 and entry.pw_gid == grp.getgrnam(name).gr_gid
        assert (entry.pw_dir, entry.pw_shell) == ("/nonexistent", "/usr/sbin/nologin")
        assert _log_lines(creating, 4)["uid"] == f"{entry.pw_uid} {entry.pw_uid}"
    finally:
        _delete_account(name)


def _delete_account(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    subprocess.run(["userdel", name], check=True, capture_output=True)


@root_only
@pytest.mark.parametrize("name", ["root", "sync-zero"])
def test_never_as_root(make_agent, name, monkeypatch):
    if name == "sync-zero":
        # An account with uid 0 under another name is root too.
        real = pwd.getpwnam
        fake = pwd.struct_passwd(("sync-zero", "x", 0, 5, "", "/", "/bin/sh"))
        monkeypatch.setattr(
            isolation.pwd, "getpwnam", lambda n: fake if n == "sync-zero" else real(n)
        )
    h = make_agent()
    h.send(launch(5, ["true"], run_as=name))
    exited = h.wait_report("exited", 5)
    assert exited["stop_reason"] == "launch_failed"
    assert "jobs never run as root or as the agent" in exited["message"]
    assert not h.of_type("started", 5)


def test_account_names_are_checked_before_anything_runs(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(LaunchError, match="run_as: 'Bad:Name' is not an account name"):
        job_account(run_as="Bad:Name", tenant="", create=True)
    with pytest.raises(LaunchError, match="not an account name"):
        # A tenant slug too long for an account name gives no default one.
        job_account(run_as="", tenant="t" * 40, create=True)


def test_account_creation_tolerates_a_concurrent_creation(monkeypatch):
    """Another agent (or test worker) made the account between the lookup and useradd:
    useradd says "already exists" (9), which counts as created."""
    made = pwd.struct_passwd(("sluice-x", "x", 990, 990, "", "/nonexistent", "/sbin/nologin"))
    lookups = iter([KeyError("sluice-x"), made])

    def getpwnam(name):
        result = next(lookups)
        if isinstance(result, Exception):
            raise result
        return result

    calls = []

    def run(args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 9, "", "useradd: user 'sluice-x' already exists")

    monkeypatch.setattr(isolation.pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(isolation.subprocess, "run", run)
    monkeypatch.setattr(isolation.shutil, "which", lambda *a, **k: "/usr/sbin/useradd")
    assert create_account("sluice-x").pw_uid == 990
    assert calls == [
        [
            "/usr/sbin/useradd",
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--user-group",
            "sluice-x",
        ]
    ]


def test_account_creation_failure_says_why(monkeypatch):
    def getpwnam(name):
        raise KeyError(name)

    monkeypatch.setattr(isolation.pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(isolation.shutil, "which", lambda *a, **k: "/usr/sbin/useradd")
    monkeypatch.setattr(
        isolation.subprocess,
        "run",
        lambda args, **kw: subprocess.CompletedProcess(args, 3, "", "useradd: invalid option"),
    )
    with pytest.raises(LaunchError, match="cannot create account 'sluice-y': useradd: invalid"):
        create_account("sluice-y")


# --- directories and modes -----------------------------------------------------------------


@root_only
def test_modes_and_owners_of_the_job_directory(make_agent, tmp_path, job_accounts):
    old = os.umask(0)  # the modes are the agent's choice, not the umask's
    try:
        h = make_agent()
        trigger = tmp_path / "go"
        h.send(launch(6, waiting_job(trigger), checkpoint_dir="run/ckpt"))
        h.wait_report("started", 6)
        h.wait_for(lambda: h.log_text(6) == "waiting\n")
        release(trigger)
        assert h.wait_report("exited", 6)["exit_code"] == 0
    finally:
        os.umask(old)
    work = h.agent.config.work_dir
    paths = h.paths(6)
    assert {_mode(work), _mode(work / "jobs"), _mode(paths.root)} == {0o711}
    for path in (paths.state, paths.exit, paths.log):
        assert (_mode(path), _owner(path)) == (0o600, "root"), path
    assert not paths.launch.exists()  # kept for a deferred launch only (the user's env)
    assert not paths.env.exists()  # the job's environment was handed over and removed
    for path in (paths.workspace, paths.workspace / "run", paths.workspace / "run/ckpt"):
        assert (_mode(path), _owner(path)) == (0o700, ACCOUNT_A), path
    assert _owner(paths.root) == "root"


def test_modes_without_root(make_agent, tmp_path, monkeypatch):
    """A non-root agent cannot switch users but keeps its files private all the same."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    h = make_agent()
    h.send(launch(7, python_job("print('hi')")))
    assert h.wait_report("exited", 7)["exit_code"] == 0
    paths = h.paths(7)
    assert _mode(paths.root) == 0o711
    assert _mode(paths.log) == _mode(paths.state) == 0o600
    assert _mode(paths.workspace) == 0o700


def test_escapes_are_refused_with_the_field_named_and_nothing_is_made(make_agent, tmp_path):
    outside = tmp_path / "attacker-chosen"
    h = make_agent()
    cases = {
        8: {"working_dir": "/"},
        9: {"working_dir": "../../../.."},
        10: {"checkpoint_dir": str(outside)},
        11: {"checkpoint_dir": "ckpt/../../.."},
        12: {"working_dir": "/etc"},
    }
    for job_id, fields in cases.items():
        h.send(launch(job_id, ["true"], **fields))
    for job_id, fields in cases.items():
        exited = h.wait_report("exited", job_id)
        field = next(iter(fields))
        assert exited["stop_reason"] == "launch_failed", job_id
        assert exited["message"].startswith(f"{field} {fields[field]!r}"), exited["message"]
        assert not h.of_type("started", job_id)
    assert not outside.exists()
    assert "must not contain '..'" in h.of_type("exited", 9)[0]["message"]
    assert "outside the job's workspace" in h.of_type("exited", 10)[0]["message"]


def test_allowed_roots_for_the_launch_tenant(make_agent, tmp_path):
    data = tmp_path / "data"
    (data / "nlp" / "ckpt").mkdir(parents=True)
    (data / "vision").mkdir()
    (data / "nlp" / "link-out").symlink_to(tmp_path)  # leads outside the root
    (data / "nlp").chmod(0o777)
    (data / "nlp" / "ckpt").chmod(0o777)
    h = make_agent(allowed_roots=(str(data / "{tenant}"),))
    nlp = str(data / "nlp")
    h.send(launch(13, ["true"], tenant="nlp", checkpoint_dir=f"{nlp}/ckpt", working_dir=nlp))
    h.send(launch(14, ["true"], tenant="vision", checkpoint_dir=f"{nlp}/ckpt"))
    h.send(launch(15, ["true"], tenant="", checkpoint_dir=f"{nlp}/ckpt"))
    h.send(launch(16, ["true"], tenant="nlp", checkpoint_dir=f"{nlp}/link-out"))
    h.send(launch(17, ["true"], tenant="nlp", checkpoint_dir=f"{nlp}/new"))
    assert h.wait_report("exited", 13)["exit_code"] == 0
    started = h.of_type("started", 13)[0]
    assert started["pid"] > 0
    messages = {job: h.wait_report("exited", job)["message"] for job in (14, 15, 16, 17)}
    assert f"under {data / 'vision'}" in messages[14]
    assert "under no allowed root" in messages[15]  # /data/{tenant} never becomes /data/
    assert "leads outside" in messages[16]
    assert "does not exist on this node" in messages[17]
    assert not (data / "nlp" / "new").exists()


def test_resolve_job_dir_rules(tmp_path):
    workspace = tmp_path / "ws"
    (tmp_path / "data" / "nlp" / "x").mkdir(parents=True)
    roots = (str(tmp_path / "data/{tenant}"), "/scratch/shared")

    def resolve(value, tenant="nlp", default="checkpoints"):
        return resolve_job_dir(
            "checkpoint_dir",
            value,
            workspace=workspace,
            default=default,
            allowed_roots=roots,
            tenant=tenant,
        )

    assert resolve("") == isolation.JobDir(workspace / "checkpoints", PurePosixPath("checkpoints"))
    assert resolve("a//b/./c").relative == PurePosixPath("a/b/c")
    assert resolve(".").path == workspace
    assert resolve(str(tmp_path / "data/nlp/x")).relative is None
    with pytest.raises(LaunchError, match="NUL"):
        resolve("a\x00b")
    with pytest.raises(LaunchError, match=r"^checkpoint_dir .*must not contain '\.\.'"):
        resolve(str(tmp_path / "data/nlp/x/../../vision"))
    assert allowed_roots_for(["/d/{tenant}", "/", "rel", "/x/../y", "/s//"], "nlp") == [
        PurePosixPath("/d/nlp"),
        PurePosixPath("/s"),
    ]
    assert allowed_roots_for(["/d/{tenant}"], "") == []
    assert allowed_roots_for(["/d/{tenant}"], "../x") == []


def test_make_workspace_never_follows_a_link(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "ckpt").symlink_to(tmp_path)
    account = JobAccount("me", os.geteuid(), os.getegid(), switched=False)
    with pytest.raises(LaunchError, match="cannot use 'ckpt' in the workspace"):
        make_workspace(workspace, [PurePosixPath("ckpt/inner")], account)
    assert not (tmp_path / "inner").exists()


# --- the work dir and what the agent says ----------------------------------------------------


@root_only
def test_a_root_agent_refuses_a_work_dir_job_accounts_cannot_reach(make_agent, tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    with pytest.raises(AgentStartError, match=re.escape(f"{private} is not searchable by other")):
        make_agent(work_dir=private / "work")
    assert not (private / "work").exists()  # refused before anything is made
    assert unreachable_parent(private) == private
    assert unreachable_parent(tmp_path) is None


def test_isolation_report_of_an_agent_that_is_not_root(make_agent, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    h = make_agent()
    register = validate_report(h.of_type("register")[0])
    report = register["isolation"]
    assert report["run_as_user"] is False
    assert report["cgroup"] is False and report["cgroup_controllers"] == []
    assert report["device_isolation"] is False
    notes = report["notes"]
    assert any(n.startswith("jobs run as the agent's user (agent not root)") for n in notes)
    assert any("CPU, memory and pids limits not enforced" in n for n in notes)
    assert any("GPU device isolation not enforced" in n for n in notes)
    # The job runs, as the agent's own user, and its report says so.
    h.send(launch(18, ["true"], run_as=ACCOUNT_B))
    started = validate_report(h.wait_report("started", 18))
    assert started["isolation"]["uid"] == 1000 and started["isolation"]["run_as"] != ACCOUNT_B


@root_only
def test_isolation_report_of_a_root_agent(make_agent):
    report = make_agent().of_type("register")[0]["isolation"]
    assert report["run_as_user"] is True
    assert not any("agent not root" in n for n in report["notes"])


def test_state_records_how_the_job_was_isolated(make_agent):
    h = make_agent()
    h.send(launch(19, ["true"]))
    h.wait_report("exited", 19)
    state = json.loads(h.paths(19).state.read_text())
    if IS_ROOT:
        assert state["isolation"]["run_as"] == ACCOUNT_A
    else:
        assert state["isolation"]["uid"] == os.geteuid()
    assert state["isolation"]["cgroup"] is None and state["cgroup_path"] is None


PRINT_PATH = 'import os; print("PATH", os.environ["PATH"])'


@root_only
def test_a_job_of_its_own_account_gets_the_system_path_not_the_agents(make_agent, job_accounts):
    h = make_agent(base_env={"PATH": "/root/.venv/bin:/usr/bin", "LANG": "C.UTF-8"})
    h.send(launch(1, python_job(PRINT_PATH), run_as=ACCOUNT_A))
    assert h.wait_report("exited", 1)["exit_code"] == 0

    assert _log_lines(h, 1)["PATH"] == SYSTEM_JOB_PATH


@root_only
def test_the_job_path_can_be_set_for_the_node(make_agent, job_accounts):
    h = make_agent(base_env={"PATH": "/root/.venv/bin"}, job_path="/opt/conda/bin:/usr/bin")
    h.send(launch(1, python_job(PRINT_PATH), run_as=ACCOUNT_A))
    assert h.wait_report("exited", 1)["exit_code"] == 0

    assert _log_lines(h, 1)["PATH"] == "/opt/conda/bin:/usr/bin"


def test_a_job_of_the_agents_own_user_keeps_the_agents_path(make_agent):
    h = make_agent(base_env={"PATH": os.environ["PATH"]})
    assert h.agent._job_base_env(False)["PATH"] == os.environ["PATH"]
    assert h.agent._job_base_env(True)["PATH"] == SYSTEM_JOB_PATH
