"""The fleet bench's heartbeat figures, read from the worker's log: the heartbeats each
drain applied and the lag of its oldest, and the p99 counted per heartbeat."""

from bench.fleet import _drain_cpu_ms, _drains, _reports_handled, _weighted_percentile

LOG = """\
[2026-12-07 20:00:01,000: INFO/ForkPoolWorker-1] Task scheduling.heartbeats_drain[a-1] \
succeeded in 0.05s: {'messages': 10, 'heartbeats': 10, 'failed': 0, 'dropped': 0, \
'lag_max_s': 0.9, 'lag_min_s': 0.1, 'cpu_ms': 5.0}
[2026-12-07 20:00:02,000: INFO/ForkPoolWorker-2] Task scheduling.heartbeats_drain[a-2] \
succeeded in 0.01s: {'messages': 0, 'heartbeats': 0, 'failed': 0, 'dropped': 0, \
'lag_max_s': None, 'lag_min_s': None, 'cpu_ms': 1.0}
[2026-12-07 20:00:03,000: INFO/ForkPoolWorker-1] Task scheduling.agent_reports[b-1] \
succeeded in 0.02s: {'reports': 3, 'invalid': 0, 'superseded_heartbeats': 0, 'failed': 0}
[2026-12-07 20:00:04,000: INFO/ForkPoolWorker-1] Task scheduling.heartbeats_drain[a-3] \
succeeded in 0.30s: {'messages': 1, 'heartbeats': 1, 'failed': 0, 'dropped': 0, \
'lag_max_s': 4.5, 'lag_min_s': 4.5, 'cpu_ms': 0.5}
"""


def test_drains_and_handled_reports_are_read_from_the_log(tmp_path):
    log = tmp_path / "worker.log"
    log.write_text(LOG)
    assert _drains(log) == [(10, 0.9), (1, 4.5)]  # the empty drain is left out
    assert _reports_handled(log) == 3 + 10 + 1
    assert _drains(tmp_path / "missing.log") == []
    assert _drain_cpu_ms(log) == (11, 6.5)  # the empty drain's CPU counts too


def test_the_percentile_counts_each_heartbeat():
    pairs = [(10, 0.9), (1, 4.5)]
    assert _weighted_percentile(pairs, 0.5) == 0.9
    assert _weighted_percentile(pairs, 0.9) == 0.9  # 10 of 11 heartbeats at 0.9 s
    assert _weighted_percentile(pairs, 0.99) == 4.5
    assert _weighted_percentile([], 0.99) is None
