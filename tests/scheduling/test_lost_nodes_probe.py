"""A control worker that was down does not take every node for lost when it comes back.

Heartbeats are recorded when a reports worker handles them; each sweep sends a probe
through the reports queue and nodes are judged up to the last probe that came back.
"""

from datetime import timedelta

from django.core.cache import cache
from django.utils import timezone

from scheduling.choices import NodeState
from scheduling.models import Node
from scheduling.services.nodes import (
    REPORTS_PROBE_KEY,
    nodes_sweep_lost,
    reports_handled_until,
    reports_probe_record,
)


def _silent(node, minutes):
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat=timezone.now() - timedelta(minutes=minutes)
    )


def test_nodes_are_not_judged_while_the_reports_do_not_flow(world):
    # The workers stopped 20 minutes ago: the last probe handled then, the nodes' last
    # heartbeats recorded then too (the agents kept sending into the queue meanwhile).
    reports_probe_record(sent_at=(timezone.now() - timedelta(minutes=20)).timestamp())
    for node in world.nodes:
        _silent(node, minutes=20)
    assert nodes_sweep_lost() == []
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.READY}


def test_a_node_silent_before_the_reports_stopped_is_still_lost(world):
    reports_probe_record(sent_at=(timezone.now() - timedelta(minutes=20)).timestamp())
    _silent(world.nodes[0], minutes=20)
    _silent(world.nodes[1], minutes=30)  # silent 10 minutes before the reports stopped
    assert nodes_sweep_lost() == [world.nodes[1].name]


def test_with_reports_flowing_a_silent_node_is_lost(world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        nodes_sweep_lost()  # sends a probe; eager in the tests, so it comes back at once
    assert cache.get(REPORTS_PROBE_KEY) is not None
    _silent(world.nodes[0], minutes=10)
    assert nodes_sweep_lost() == [world.nodes[0].name]


def test_the_reference_is_now_while_probes_come_back():
    now = timezone.now()
    assert reports_handled_until(now) == now  # nothing known
    reports_probe_record(sent_at=(now - timedelta(seconds=3)).timestamp())
    assert reports_handled_until(now) == now
    reports_probe_record(sent_at=(now - timedelta(hours=1)).timestamp())  # older: ignored
    assert reports_handled_until(now) == now
