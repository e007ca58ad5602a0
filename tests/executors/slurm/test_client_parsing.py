"""Parsing of what Slurm 22.05's commands print, on output captured from real daemons
(tools/slurm_cluster.py: four nodes of gpu:h100:8): ``sinfo --json``, ``squeue --noheader
--Format=<squeue_format()>`` and ``scontrol --details show job``."""

from pathlib import Path

import pytest

from scheduling.executors.slurm.client import (
    SlurmError,
    decode_wait_status,
    end_message,
    expand_indices,
    parse_gres,
    parse_job_gres_indices,
    parse_sinfo,
    parse_squeue,
    sluice_ids,
)

DATA = Path(__file__).parent / "data"


def test_sinfo_nodes_with_gpu_gres_and_used_indices():
    nodes = {n.name: n for n in parse_sinfo((DATA / "sinfo.json").read_text())}
    assert sorted(nodes) == ["sn1", "sn2", "sn3", "sn4"]
    sn4 = nodes["sn4"]
    assert (sn4.gpus, sn4.gpu_type, sn4.cpus, sn4.memory_mb) == (8, "h100", 16, 64000)
    assert sn4.partitions == ("sluice",)
    assert sn4.gpus_used == (0, 1, 2, 3, 4, 5, 6)  # gpu:h100:7(IDX:0-6)
    assert sn4.state == "mixed" and sn4.usable
    assert nodes["sn1"].gpus_used == ()


def test_squeue_states_exit_codes_and_signals():
    jobs = {j.job_id: j for j in parse_squeue((DATA / "squeue_states.txt").read_text())}
    completed, failed, killed = jobs["1"], jobs["2"], jobs["3"]
    assert (completed.state, completed.sluice) == ("COMPLETED", (10, 1))
    assert decode_wait_status(completed.exit_status) == (0, None)
    assert (failed.state, decode_wait_status(failed.exit_status)) == ("FAILED", (3, None))
    assert end_message(failed) == ""
    # `kill -9 $$` in the script: Slurm says FAILED with the signal in the low bits.
    assert (killed.state, decode_wait_status(killed.exit_status)) == ("FAILED", (None, 9))
    assert killed.sluice == (12, 2) and end_message(killed) == ""
    cancelled, timeout = jobs["4"], jobs["5"]
    assert cancelled.state == "CANCELLED" and decode_wait_status(cancelled.exit_status) == (
        None,
        15,
    )
    assert end_message(cancelled) == "cancelled in Slurm"
    assert timeout.state == "TIMEOUT" and end_message(timeout) == "Slurm's time limit was reached"
    assert not timeout.active and timeout.started


def test_squeue_running_outside_and_pending_pinned_jobs():
    jobs = {j.job_id: j for j in parse_squeue((DATA / "squeue_states.txt").read_text())}
    outside = jobs["6"]
    assert outside.sluice is None and outside.state == "RUNNING"
    assert outside.name == "someones-training" and outside.user == "root"
    assert outside.gpus_requested == 7 and outside.started and outside.start_time > 0
    # Its GPU indices, from scontrol (gpu:h100:7(IDX:0-6)).
    shown = (DATA / "scontrol_show_job_outside.txt").read_text()
    assert parse_job_gres_indices(shown) == (0, 1, 2, 3, 4, 5, 6)
    pending = jobs["7"]
    assert pending.state == "PENDING" and pending.active and not pending.started
    assert pending.nodes == "" and pending.node == "sn4"  # pinned with --nodelist
    assert pending.gpus_requested == 2 and pending.sluice == (15, 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:h100:8", [("gpu", "h100", 8, ())]),
        ("gpu:h100:2(IDX:0-1)", [("gpu", "h100", 2, (0, 1))]),
        ("gpu:4(IDX:0,2-3,7),mps:100", [("gpu", "", 4, (0, 2, 3, 7)), ("mps", "", 100, ())]),
        ("gpu:a100:0(IDX:N/A)", [("gpu", "a100", 0, ())]),
        ("(null)", []),
        ("", []),
    ],
)
def test_parse_gres(text, expected):
    assert [(g.name, g.type, g.count, g.indices) for g in parse_gres(text)] == expected


def test_sluice_ids_only_from_sluices_comment():
    assert sluice_ids("sluice:12:3") == (12, 3)
    assert sluice_ids("sluice job=1 attempt=1") is None
    assert sluice_ids("") is None


def test_wait_status_and_ranges():
    assert decode_wait_status(768) == (3, None)
    assert decode_wait_status(137) == (None, 9)
    assert decode_wait_status(None) == (None, None)
    assert expand_indices("0-2,5") == [0, 1, 2, 5]


def test_errors_from_the_controller_are_refused():
    with pytest.raises(SlurmError):
        parse_squeue("slurm_load_jobs error: Unable to contact slurm controller\n")
    with pytest.raises(SlurmError):
        parse_sinfo("slurm_load_partitions: Unable to contact slurm controller")
