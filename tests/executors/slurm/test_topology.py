"""Topology blocks from ``scontrol show topology``, on output captured from Slurm 22.05's
controller (tools/slurm_cluster.py with ``TopologyPlugin=topology/tree`` and a
topology.conf of two leaf switches under a spine; node sn8 hangs from no switch)."""

from pathlib import Path

import pytest

from scheduling.executors.base import TOPOLOGY_LABEL
from scheduling.executors.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmNode,
    expand_hostlist,
    parse_topology,
)
from scheduling.executors.slurm.executor import SlurmExecutor

DATA = Path(__file__).parent / "data"


def test_leaf_switches_are_the_blocks():
    blocks = parse_topology((DATA / "scontrol_show_topology_tree.txt").read_text())
    assert blocks == {
        "sn1": "leaf1",
        "sn2": "leaf1",
        "sn3": "leaf1",
        "sn4": "leaf1",
        "sn5": "leaf2",
        "sn6": "leaf2",
        "sn7": "leaf2",
    }  # the spine (Level=1) names no block; sn8 is in none


def test_the_block_plugin_names_the_blocks():
    text = "BlockName=b1 BlockIndex=0 Nodes=gpu[01-02] BlockSize=2\n"
    text += "BlockName=b2 BlockIndex=1 Nodes=gpu[03-04] BlockSize=2\n"
    assert parse_topology(text) == {"gpu01": "b1", "gpu02": "b1", "gpu03": "b2", "gpu04": "b2"}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("sn[1-3,7]", ["sn1", "sn2", "sn3", "sn7"]),
        ("gpu-a[01-02],head", ["gpu-a01", "gpu-a02", "head"]),
        ("n5", ["n5"]),
        ("", []),
    ],
)
def test_host_lists(text, names):
    assert expand_hostlist(text) == names


class TopologyClient(SlurmClient):
    """A controller answering ``scontrol show topology`` and ``sinfo`` from fixtures."""

    def __init__(self, topology: str | None):
        super().__init__(partition="sluice")
        self.topology_text = topology

    def run(self, args, *, stdin=None):
        if list(args) == ["scontrol", "show", "topology"]:
            if self.topology_text is None:
                raise SlurmError(
                    "scontrol failed: scontrol: error: No topology information available"
                )
            return self.topology_text
        raise AssertionError(args)

    def nodes(self):
        return [
            SlurmNode(name, name, "idle", 16, 64000, ("sluice",), 8, "h100", ())
            for name in ("sn4", "sn5", "sn8")
        ]


def test_nodes_carry_their_leaf_switch_as_the_topology_label(tmp_path):
    client = TopologyClient((DATA / "scontrol_show_topology_tree.txt").read_text())
    nodes = {n.name: n for n in SlurmExecutor(client=client, work_dir=tmp_path).nodes()}
    assert nodes["sn4"].labels[TOPOLOGY_LABEL] == "leaf1"
    assert nodes["sn5"].labels[TOPOLOGY_LABEL] == "leaf2"
    assert TOPOLOGY_LABEL not in nodes["sn8"].labels


def test_without_a_topology_plugin_nodes_are_in_no_block(tmp_path):
    client = TopologyClient(None)
    nodes = SlurmExecutor(client=client, work_dir=tmp_path).nodes()
    assert all(TOPOLOGY_LABEL not in n.labels for n in nodes)


def test_other_controller_errors_are_not_taken_for_no_topology():
    class Down(TopologyClient):
        def run(self, args, *, stdin=None):
            raise SlurmError("scontrol failed: Unable to contact slurm controller")

    with pytest.raises(SlurmError):
        Down("").topology()
