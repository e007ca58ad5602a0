"""The snapshot read in its three parts: the cluster state, the frozen policy, and the
caches (``kept_cluster``); every field of the snapshot is in exactly one of them."""

import copy
import dataclasses
import pickle

import pytest
from engine_builders import job, node, quota, snapshot

from scheduling.engine import KeptCluster, Snapshot
from scheduling.engine.snapshot import ClusterState, Policy

CACHES = {"kept_cluster"}


def _names(record_type) -> set[str]:
    return {item.name for item in dataclasses.fields(record_type)}


def test_every_field_of_the_snapshot_is_in_exactly_one_part():
    state, policy = _names(ClusterState), _names(Policy)
    assert not (state & policy) and not (state & CACHES) and not (policy & CACHES)
    assert state | policy | CACHES == _names(Snapshot)


def test_the_policy_carries_every_setting_of_the_snapshot():
    # Each setting other than its default, so that a setting dropped or swapped shows.
    changed = {}
    for item in dataclasses.fields(Policy):
        default = item.default
        if isinstance(default, bool):
            changed[item.name] = not default
        elif isinstance(default, tuple):
            changed[item.name] = (*default, 17.5e6)
        else:
            changed[item.name] = default + 17.5
    snap = dataclasses.replace(snapshot([node(1)], [quota("a", 8)], [job(1)]), **changed)
    policy = snap.policy()
    assert {name: getattr(policy, name) for name in changed} == changed


def test_the_policy_s_defaults_are_the_snapshot_s():
    bare = Snapshot(now=0.0, nodes=[], quotas=[], queues=[], running=[], pending=[])
    assert bare.policy() == Policy()


def test_the_policy_is_frozen_and_copies_whole():
    policy = snapshot([node(1)], [quota("a", 8)], [job(1)], backfill=False).policy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.backfill = True  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(policy)) == policy
    assert copy.deepcopy(policy) == policy and copy.copy(policy) == policy


def test_the_cluster_state_shares_the_snapshot_s_records():
    keep = KeptCluster()
    snap = snapshot([node(1)], [quota("a", 8)], [job(1)], kept_cluster=keep)
    state = snap.cluster_state()
    assert state.now == snap.now
    for name in _names(ClusterState) - {"now"}:
        assert getattr(state, name) is getattr(snap, name)
    assert snap.kept_cluster is keep


def test_a_policy_is_made_once_per_set_of_settings_and_follows_the_snapshot():
    snap = snapshot([node(1)], [quota("a", 8)], [job(1)])
    first = snap.policy()
    assert snap.policy() is first
    # The dispatch loop sets a snapshot's settings after making it: the next cycle's
    # policy has them.
    snap.decisions_only = True
    changed = snap.policy()
    assert changed.decisions_only is True and first.decisions_only is False
    assert dataclasses.replace(changed, decisions_only=False) == first
