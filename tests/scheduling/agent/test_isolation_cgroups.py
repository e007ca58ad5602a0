"""cgroup v2 per job: detection, the slice and the job's limits, against a made-up cgroup2
tree in tmp_path (and the real machine's mounts, where nothing may be written)."""

import os
from pathlib import Path

import pytest

from scheduling.agent.isolation import (
    CgroupSupport,
    cgroup2_mounts,
    create_job_cgroup,
    isolation_report,
    prepare_cgroups,
    proc_hidden,
    remove_job_cgroup,
)
from scheduling.agent.protocol import validate_report
from scheduling.agent.runner import LaunchError
from tests.scheduling.agent.helpers import IS_ROOT, NOT_ROOT_REASON, launch, python_job

HYBRID_MOUNTS = """\
proc /proc proc rw,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 {unified} cgroup2 rw,relatime 0 0
"""


def fake_cgroup2(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    """A directory that looks like the root of a cgroup v2 hierarchy."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def test_mounts_are_parsed_with_the_unified_layout_first(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
        "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"
        "cgroup2 /mnt/with\\040space cgroup2 rw 0 0\n"
        "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
    )
    assert cgroup2_mounts(str(mounts)) == [
        Path("/sys/fs/cgroup"),
        Path("/sys/fs/cgroup/unified"),
        Path("/mnt/with space"),
    ]
    assert cgroup2_mounts(str(tmp_path / "none")) == []


def test_a_hybrid_node_without_controllers_in_cgroup2_enforces_nothing(tmp_path):
    unified = fake_cgroup2(tmp_path / "unified", controllers="")
    mounts = tmp_path / "mounts"
    mounts.write_text(HYBRID_MOUNTS.format(unified=unified))
    support = prepare_cgroups(mounts_file=str(mounts))
    assert support.slice is None and support.controllers == ()
    assert "has no cpu, memory or pids controller" in support.note
    assert not (unified / "sluice.slice").exists()  # nothing made where nothing holds


def test_no_cgroup2_at_all(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    assert prepare_cgroups(mounts_file=str(mounts)) == CgroupSupport(
        None, note="no cgroup v2 hierarchy mounted"
    )


def test_detection_on_this_machine_is_false_where_cgroup2_has_no_controllers():
    """The real mounts: where no cgroup2 mount offers cpu, memory or pids (this machine:
    cgroup v1 with an empty unified mount), the agent must say limits are not enforced."""
    usable = [
        m
        for m in cgroup2_mounts()
        if {"cpu", "memory", "pids"} & set(_words(m / "cgroup.controllers"))
    ]
    if usable:
        pytest.skip(f"this machine has a cgroup v2 hierarchy with controllers ({usable[0]})")
    report = isolation_report()
    assert report.cgroups.slice is None
    assert report.report()["cgroup"] is False
    assert any(
        n.startswith("no cgroup v2 hierarchy writable")
        and n.endswith("CPU, memory and pids limits not enforced")
        for n in report.notes
    )


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def test_the_slice_is_made_and_controllers_enabled(tmp_path):
    root = fake_cgroup2(tmp_path / "cg", controllers="cpu io memory")
    support = prepare_cgroups(root)
    assert support.slice == root / "sluice.slice"
    assert support.controllers == ("cpu", "memory")
    assert support.note == "cgroup controllers not available: pids"
    # Written one by one (a fake file keeps the last), in the root and in the slice.
    assert (root / "cgroup.subtree_control").read_text() == "+memory"
    assert (support.slice / "cgroup.subtree_control").read_text() == "+memory"


def test_a_cgroup2_directory_the_agent_cannot_write_is_no_use(tmp_path, monkeypatch):
    root = fake_cgroup2(tmp_path / "cg")
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    support = prepare_cgroups(root)
    assert support.slice is None and "is not writable" in support.note


def test_job_cgroup_limits(tmp_path):
    support = prepare_cgroups(fake_cgroup2(tmp_path / "cg"))
    path, enforced = create_job_cgroup(
        support, "job-7-1", {"cpus": 1.5, "memory_mb": 2048, "pids": 64}
    )
    assert path == tmp_path / "cg/sluice.slice/job-7-1"
    assert (path / "cpu.max").read_text() == "150000 100000"
    assert (path / "memory.max").read_text() == str(2048 * 1024 * 1024)
    assert (path / "pids.max").read_text() == "64"
    assert enforced == {"cpus": 1.5, "memory_mb": 2048, "pids": 64}

    tiny, enforced = create_job_cgroup(support, "job-8-1", {"cpus": 0.001, "memory_mb": None})
    assert (tiny / "cpu.max").read_text() == "1000 100000"  # the kernel's least quota
    assert not (tiny / "memory.max").exists() and enforced == {"cpus": 0.001}


def test_limits_of_a_controller_the_node_lacks_are_not_claimed(tmp_path):
    support = prepare_cgroups(fake_cgroup2(tmp_path / "cg", controllers="memory"))
    path, enforced = create_job_cgroup(support, "job-9-1", {"cpus": 2, "memory_mb": 10, "pids": 5})
    assert enforced == {"memory_mb": 10}
    assert not (path / "cpu.max").exists() and not (path / "pids.max").exists()


def test_a_limit_that_cannot_be_written_fails_and_removes_the_cgroup(tmp_path):
    support = prepare_cgroups(fake_cgroup2(tmp_path / "cg"))
    (support.slice / "job-1-1" / "memory.max").mkdir(parents=True)  # writing it fails
    with pytest.raises(LaunchError, match="cannot set the limits of cgroup"):
        create_job_cgroup(support, "job-1-1", {"memory_mb": 10})


def test_removing_a_job_cgroup_kills_what_is_left_first(tmp_path):
    empty = tmp_path / "job-1-1"
    empty.mkdir()
    assert remove_job_cgroup(empty) is True and not empty.exists()
    assert remove_job_cgroup(empty) is True  # gone already

    busy = tmp_path / "job-2-1"
    busy.mkdir()
    (busy / "cgroup.kill").write_text("")
    assert remove_job_cgroup(busy) is False  # (a fake cgroup keeps its files: not removable)
    assert (busy / "cgroup.kill").read_text() == "1"


def test_proc_hidepid_is_detected(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw,nosuid,hidepid=invisible 0 0\n")
    assert proc_hidden(str(mounts)) is True
    mounts.write_text("proc /proc proc rw,relatime 0 0\n")
    assert proc_hidden(str(mounts)) is False


@pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)
def test_a_job_runs_inside_its_cgroup_which_is_removed_afterwards(make_agent, tmp_path):
    root = fake_cgroup2(tmp_path / "cg")
    h = make_agent(cgroup_root=root, heartbeat_seconds=0.05)
    register = validate_report(h.of_type("register")[0])
    assert register["isolation"]["cgroup"] is True
    assert register["isolation"]["cgroup_controllers"] == ["cpu", "memory", "pids"]

    h.send(launch(1, python_job("print('hi')"), limits={"cpus": 2, "memory_mb": 512}))
    started = validate_report(h.wait_report("started", 1))
    job_cgroup = root / "sluice.slice" / "job-1-1"
    assert started["isolation"]["cgroup"] == str(job_cgroup)
    assert started["isolation"]["limits"] == {"cpus": 2, "memory_mb": 512}
    assert (job_cgroup / "cpu.max").read_text() == "200000 100000"
    # The wrapper joined before starting the command: the whole job is inside.
    assert (job_cgroup / "cgroup.procs").read_text() == str(started["pid"])
    h.wait_report("exited", 1)
    record = h.agent.jobs[(1, 1)]
    assert record.cgroup_path == str(job_cgroup)  # the fake keeps files: not removable yet
    for entry in job_cgroup.iterdir():  # (the kernel would empty it once the job is gone)
        entry.unlink()
    h.wait_for(lambda: record.cgroup_path is None)
    assert not job_cgroup.exists()


@pytest.mark.skipif(not IS_ROOT, reason=NOT_ROOT_REASON)
def test_a_cgroup_the_wrapper_cannot_join_fails_the_launch(make_agent, tmp_path):
    root = fake_cgroup2(tmp_path / "cg")
    h = make_agent(cgroup_root=root)
    (root / "sluice.slice" / "job-2-1" / "cgroup.procs").mkdir(parents=True)
    h.send(launch(2, ["true"]))
    exited = h.wait_report("exited", 2)
    assert exited["stop_reason"] == "launch_failed"
    assert "cannot join the job's cgroup" in exited["message"]
