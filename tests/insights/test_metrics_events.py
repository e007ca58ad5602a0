"""/metrics, the events part: admission waits and dispatch cycles observed where they
happen (insights.instrument), in prometheus-client's multiprocess mode, merged from the
files of every process. Every test points the directory at its own tmp dir."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.utils import timezone

from insights import instrument, metrics
from scheduling.services.dispatch import dispatch_cycle
from tests import factories as f
from tests.insights.metrics_helpers import multiprocess_metrics, of, parse, scrape, value

ROOT = Path(__file__).resolve().parents[2]
WAIT = "sluice_admission_wait_seconds"
CYCLE = "sluice_dispatch_cycle_duration_seconds"


@pytest.fixture
def multiproc_dir(tmp_path, monkeypatch, settings):
    """prometheus-client in multiprocess mode on ``tmp_path`` (see multiprocess_metrics)."""
    with multiprocess_metrics(tmp_path, monkeypatch, settings) as path:
        yield path


def _in_another_process(path: Path, code: str) -> int:
    """Run ``code`` in a new Python process writing to ``path``; returns its pid."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(path)}
    script = f"import os, sys\nsys.path.insert(0, {str(ROOT)!r})\n" + textwrap.dedent(code)
    script += "\nprint(os.getpid())\n"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


def test_dispatch_observes_each_admission_and_the_cycle(
    world, multiproc_dir, client, django_capture_on_commit_callbacks
):
    now = timezone.now()
    for minutes, priority in ((25, world.normal), (90, world.normal), (5, world.high)):
        f.JobFactory(
            queue=world.queue,
            project=world.project,
            submitted_by=world.member,
            base_priority_class=priority,
            priority_class=priority,
            submitted_at=now - timedelta(minutes=minutes),
        )
    with django_capture_on_commit_callbacks(execute=True):
        stats = dispatch_cycle()
    assert stats["placed"] == 3
    samples = scrape(client)
    normal = {"pool": "training", "tenant": "nlp", "queue": "nlp/train", "priority_class": "normal"}
    high = {**normal, "priority_class": "high"}
    assert value(samples, f"{WAIT}_count", **normal) == 2
    assert value(samples, f"{WAIT}_sum", **normal) == pytest.approx(115 * 60, abs=60)
    # 25 min waited: in the 1800 s bucket; 90 min: only from the 7200 s bucket on.
    assert value(samples, f"{WAIT}_bucket", **normal, le="1800.0") == 1
    assert value(samples, f"{WAIT}_bucket", **normal, le="3600.0") == 1
    assert value(samples, f"{WAIT}_bucket", **normal, le="7200.0") == 2
    assert value(samples, f"{WAIT}_bucket", **normal, le="+Inf") == 2
    assert value(samples, f"{WAIT}_count", **high) == 1
    assert value(samples, f"{CYCLE}_count") == 1
    assert value(samples, f"{CYCLE}_sum") > 0
    assert list(multiproc_dir.glob("histogram_*.db"))


def test_a_rolled_back_cycle_admits_nobody(
    world, multiproc_dir, client, django_capture_on_commit_callbacks
):
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    with django_capture_on_commit_callbacks(execute=False):
        dispatch_cycle()  # the callbacks are dropped, as a rollback would
    assert of(scrape(client), f"{WAIT}_count") == {}


def test_a_cycle_that_is_not_the_leaders_is_not_observed(world, multiproc_dir, client, monkeypatch):
    import contextlib

    from scheduling.services import dispatch

    @contextlib.contextmanager
    def follower():
        yield False

    monkeypatch.setattr(dispatch, "_leader_lock", follower)
    assert dispatch_cycle() == {"skipped": True}
    assert value(scrape(client), f"{CYCLE}_count") is None


def test_events_of_every_process_are_summed(world, multiproc_dir, client):
    instrument.dispatch_cycle_observe(0.02)
    instrument.dispatch_cycle_observe(0.3)
    other = _in_another_process(
        multiproc_dir,
        """
        from insights import instrument
        for seconds in (0.004, 0.02, 7.0):
            instrument.dispatch_cycle_observe(seconds)
        instrument._get().admission_wait.labels("training", "nlp", "nlp/train", "low").observe(42)
        """,
    )
    assert other != os.getpid()
    assert (multiproc_dir / f"histogram_{other}.db").exists()
    samples = scrape(client)
    assert value(samples, f"{CYCLE}_count") == 5
    assert value(samples, f"{CYCLE}_sum") == pytest.approx(7.344)
    assert value(samples, f"{CYCLE}_bucket", le="0.005") == 1
    assert value(samples, f"{CYCLE}_bucket", le="0.025") == 3
    assert value(samples, f"{CYCLE}_bucket", le="0.5") == 4
    assert value(samples, f"{CYCLE}_bucket", le="+Inf") == 5
    low = {"pool": "training", "tenant": "nlp", "queue": "nlp/train", "priority_class": "low"}
    assert value(samples, f"{WAIT}_count", **low) == 1
    assert value(samples, f"{WAIT}_bucket", **low, le="30.0") == 0
    assert value(samples, f"{WAIT}_bucket", **low, le="60.0") == 1


def test_our_merge_says_what_prometheus_clients_says(world, multiproc_dir):
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    histogram = instrument._get().admission_wait
    for i, seconds in enumerate((0.5, 3, 70, 4000, 10**6)):
        histogram.labels("training", "nlp", f'nlp/q{i % 2}"x', "normal").observe(seconds)
    instrument.dispatch_cycle_observe(0.07)
    _in_another_process(
        multiproc_dir,
        """
        from insights import instrument
        instrument._get().admission_wait.labels("training", "nlp", 'nlp/q1"x', "normal").observe(9)
        """,
    )
    registry = CollectorRegistry(auto_describe=False)
    multiprocess.MultiProcessCollector(registry, path=str(multiproc_dir))
    theirs = generate_latest(registry).decode()
    ours = metrics.events_text()
    assert parse(ours) == parse(theirs)
    assert "# TYPE sluice_admission_wait_seconds histogram" in ours


def test_no_files_no_events(world, multiproc_dir, client):
    text = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert WAIT not in text and CYCLE not in text
    assert "sluice_pool_gpus" in text


def test_a_metric_never_breaks_the_cycle(world, multiproc_dir, monkeypatch, caplog):
    def broken(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(instrument, "_get", broken)
    instrument.dispatch_cycle_observe(0.1)
    instrument._observe_waits([(("a", "b", "c", "d"), 1.0)])
    instrument.admissions_observe([SimpleNamespace()], timezone.now())  # no queue: logged
    assert "not observed" in caplog.text


def test_dir_prepare_removes_only_files_of_exited_processes(multiproc_dir):
    dead = _in_another_process(multiproc_dir, "pass")
    mine = os.getpid()
    for name in (
        f"histogram_{dead}.db",
        f"gauge_livesum_{dead}.db",
        f"counter_{dead}.db",
        f"histogram_{mine}.db",
        f"histogram_{os.getppid()}.db",
        "notes.txt",
    ):
        (multiproc_dir / name).write_bytes(b"")
    assert instrument.multiprocess_dir_prepare(multiproc_dir) == 3
    assert sorted(p.name for p in multiproc_dir.iterdir()) == sorted(
        [f"histogram_{mine}.db", f"histogram_{os.getppid()}.db", "notes.txt"]
    )


def test_dir_prepare_creates_the_directory(tmp_path):
    path = tmp_path / "new" / "prometheus"
    assert instrument.multiprocess_dir_prepare(path) == 0
    assert path.is_dir()


def test_a_dead_process_keeps_its_counts_and_loses_its_live_gauges(multiproc_dir):
    for name in ("histogram_4242.db", "gauge_livesum_4242.db", "gauge_liveall_4242.db"):
        (multiproc_dir / name).write_bytes(b"")
    instrument.process_dead(4242)
    assert [p.name for p in multiproc_dir.iterdir()] == ["histogram_4242.db"]


def test_gunicorn_hooks(tmp_path, monkeypatch):
    path = tmp_path / "prometheus"
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("SLUICE_VAR_DIR", str(tmp_path))
    spec = importlib.util.spec_from_file_location("sluice_gunicorn_conf", ROOT / "gunicorn.conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(path)
    logged = []
    server = SimpleNamespace(log=SimpleNamespace(info=lambda *a: logged.append(a)))
    conf.on_starting(server)
    assert path.is_dir()
    (path / "gauge_livemax_777.db").write_bytes(b"")
    (path / "histogram_777.db").write_bytes(b"")
    conf.child_exit(server, SimpleNamespace(pid=777))
    assert [p.name for p in path.iterdir()] == ["histogram_777.db"]
    conf.on_starting(server)  # a restart: pid 777 runs no more
    assert list(path.iterdir()) == [] or _alive(777)
    assert logged or _alive(777)


def _alive(pid: int) -> bool:
    return instrument._alive(pid)


def test_celery_hooks(multiproc_dir):
    from portal import celery

    (multiproc_dir / "gauge_livesum_5151.db").write_bytes(b"")
    (multiproc_dir / "counter_5151.db").write_bytes(b"")
    celery._metrics_process_dead(pid=5151)
    assert [p.name for p in multiproc_dir.iterdir()] == ["counter_5151.db"]
    celery._metrics_dir_prepare()
    assert list(multiproc_dir.iterdir()) == [] or _alive(5151)
