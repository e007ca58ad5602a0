"""/metrics, the state part: read from the database at scrape time (insights.metrics)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone
from freezegun import freeze_time

from insights import metrics
from scheduling.choices import GpuHealth, JobState, NodeState, ReclaimKind
from scheduling.models import Allocation, Gpu, Node, ReclaimRecord
from tests import factories as f
from tests.insights.metrics_helpers import job, of, parse, placed, sample, scrape, value

MIB = 1024 * 1024
H100 = "H100-80GB"


@pytest.fixture(autouse=True)
def _no_stored_totals():
    cache.delete(metrics.TOTALS_CACHE_KEY)
    yield
    cache.delete(metrics.TOTALS_CACHE_KEY)


def _gpus(node):
    return list(Gpu.objects.filter(node=node).order_by("index"))


@pytest.fixture
def cluster(world):
    """Node 1: a 4-GPU nlp job (two GPUs busy, two idle), a 2-GPU borrowed vision job not
    sampled yet, a free GPU whose sample is stale, an unhealthy GPU. Node 2: cordoned."""
    now = timezone.now()
    node1, node2 = world.nodes
    gpus = _gpus(node1)
    nlp_job = placed(world, gpus[0:4])
    for gpu, utilization in zip(gpus[0:4], (90.0, 80.0, 2.0, 0.0), strict=True):
        sample(gpu, utilization, memory_used_mb=1000)
    vision_job = placed(world, gpus[4:6], queue=world.other_queue, state=JobState.ADMITTED)
    Allocation.objects.filter(job=vision_job).update(borrowed=True)
    sample(gpus[6], 50.0, age_seconds=600)
    Gpu.objects.filter(pk=gpus[7].pk).update(health=GpuHealth.UNHEALTHY)
    Node.objects.filter(pk=node1.pk).update(last_heartbeat=now - timedelta(seconds=12))
    Node.objects.filter(pk=node2.pk).update(state=NodeState.CORDONED, last_heartbeat=None)
    # Waiting: nlp has two quota-blocked jobs (the older waiting an hour), one no cycle has
    # seen, one held; vision a requeued job waiting again for 10 minutes.
    job(
        world,
        gpus_per_node=2,
        pending_reason_code="WAITING_FOR_QUOTA",
        submitted_at=now - timedelta(hours=1),
    )
    job(world, gpus_per_node=1, pending_reason_code="WAITING_FOR_QUOTA", submitted_at=now)
    job(world, gpus_per_node=4, submitted_at=now)
    job(world, state=JobState.HELD, gpus_per_node=8, submitted_at=now - timedelta(days=2))
    job(
        world,
        queue=world.other_queue,
        pending_reason_code="WAITING_FOR_GPUS",
        submitted_at=now - timedelta(hours=2),
        queued_at=now - timedelta(minutes=10),
        requeue_count=1,
    )
    return {"now": now, "nlp_job": nlp_job, "vision_job": vision_job, "gpus": gpus}


def _state(now):
    return parse(metrics.database_text(now))


def test_pending_jobs_by_queue_and_reason(cluster):
    samples = _state(cluster["now"])
    nlp = {"pool": "training", "tenant": "nlp", "queue": "nlp/train"}
    vision = {"pool": "training", "tenant": "vision", "queue": "vision/train"}
    assert of(samples, "sluice_pending_jobs") == {
        frozenset({**nlp, "reason": "WAITING_FOR_QUOTA"}.items()): 2,
        frozenset({**nlp, "reason": "NEW"}.items()): 1,
        frozenset({**nlp, "reason": "HELD"}.items()): 1,
        frozenset({**vision, "reason": "WAITING_FOR_GPUS"}.items()): 1,
    }
    # Held jobs ask for GPUs too, but they are not waiting for the scheduler.
    assert value(samples, "sluice_pending_gpus", **nlp) == 7
    assert value(samples, "sluice_pending_gpus", **vision) == 1
    # The held job waits longest but is not counted; the requeued job's wait is its
    # current attempt's.
    assert value(samples, "sluice_queue_oldest_wait_seconds", **nlp) == 3600
    assert value(samples, "sluice_queue_oldest_wait_seconds", **vision) == 600


def test_running_jobs_and_gpus_by_pool_tenant_and_model(cluster):
    samples = _state(cluster["now"])
    assert of(samples, "sluice_running_jobs") == {
        frozenset(
            {
                "pool": "training",
                "tenant": "nlp",
                "queue": "nlp/train",
                "gpu_model": H100,
                "state": "RUNNING",
            }.items()
        ): 1,
        frozenset(
            {
                "pool": "training",
                "tenant": "vision",
                "queue": "vision/train",
                "gpu_model": H100,
                "state": "ADMITTED",
            }.items()
        ): 1,
    }
    pool = {"pool": "training", "gpu_model": H100}
    assert value(samples, "sluice_pool_gpus", **pool, status="allocated") == 6
    assert value(samples, "sluice_pool_gpus", **pool, status="free") == 1
    # 8 on the cordoned node, 1 unhealthy.
    assert value(samples, "sluice_pool_gpus", **pool, status="unavailable") == 9
    nlp = {"pool": "training", "tenant": "nlp", "gpu_model": H100}
    vision = {"pool": "training", "tenant": "vision", "gpu_model": H100}
    assert value(samples, "sluice_allocated_gpus", **nlp) == 4
    assert value(samples, "sluice_used_gpus", **nlp) == pytest.approx(0.9 + 0.8 + 0.02 + 0.0)
    assert value(samples, "sluice_idle_gpus", **nlp) == 2  # below the 5 % threshold
    assert value(samples, "sluice_borrowed_gpus", **nlp) == 0
    assert value(samples, "sluice_allocated_gpus", **vision) == 2
    assert value(samples, "sluice_borrowed_gpus", **vision) == 2
    # Not sampled yet: neither used nor idle.
    assert value(samples, "sluice_used_gpus", **vision) == 0
    assert value(samples, "sluice_idle_gpus", **vision) == 0


def test_idle_threshold_is_the_jobs_policys(cluster):
    f.policy("training", idle_utilization_threshold=85.0)
    samples = _state(cluster["now"])
    # 80 % and below are idle for this policy now: three of the four.
    assert value(samples, "sluice_idle_gpus", pool="training", tenant="nlp", gpu_model=H100) == 3


def test_per_gpu_samples_dcgm_style(cluster):
    samples = _state(cluster["now"])
    gpus = cluster["gpus"]
    first = {"node": "gpu-01", "gpu": 0, "uuid": gpus[0].uuid, "model": H100, "pool": "training"}
    assert value(samples, "sluice_gpu_utilization_percent", **first) == 90.0
    assert value(samples, "sluice_gpu_memory_used_bytes", **first) == 1000 * MIB
    assert value(samples, "sluice_gpu_memory_total_bytes", **first) == 81559 * MIB
    assert value(samples, "sluice_gpu_allocated", **first) == 1
    stale = {**first, "gpu": 6, "uuid": gpus[6].uuid}
    assert value(samples, "sluice_gpu_utilization_percent", **stale) is None
    assert value(samples, "sluice_gpu_memory_used_bytes", **stale) is None
    assert value(samples, "sluice_gpu_allocated", **stale) == 0
    assert value(samples, "sluice_gpu_memory_total_bytes", **stale) == 81559 * MIB
    assert len(of(samples, "sluice_gpu_allocated")) == 16
    assert len(of(samples, "sluice_gpu_utilization_percent")) == 4


def test_nodes_and_heartbeat_age(cluster):
    samples = _state(cluster["now"])
    assert value(samples, "sluice_nodes", pool="training", state="ready") == 1
    assert value(samples, "sluice_nodes", pool="training", state="cordoned") == 1
    assert of(samples, "sluice_node_heartbeat_age_seconds") == {
        frozenset({"node": "gpu-01", "pool": "training"}.items()): 12.0
    }


def test_quotas(cluster):
    samples = _state(cluster["now"])
    for tenant in ("nlp", "vision"):
        key = {"pool": "training", "tenant": tenant, "gpu_model": "any"}
        assert value(samples, "sluice_quota_guaranteed_gpus", **key) == 8
        assert value(samples, "sluice_quota_borrow_limit_gpus", **key) == 8


@pytest.fixture
def history(world):
    """Ended jobs and reclaims of both tenants."""
    done = timezone.now()
    for _ in range(3):
        job(world, state=JobState.SUCCEEDED, exit_code=0, finished_at=done)
    for _ in range(2):
        job(world, state=JobState.FAILED, exit_code=1, finished_at=done)
    job(world, state=JobState.FAILED, exit_signal=9, workload_type="evaluation", finished_at=done)
    job(world, state=JobState.CANCELLED, finished_at=done)  # cancelled while pending
    job(world, state=JobState.TIMED_OUT, stop_reason="timed_out", finished_at=done)
    job(world, state=JobState.PREEMPTED, stop_reason="preempted", preemption_count=1)
    job(world, state=JobState.PENDING, preemption_count=2)  # requeued twice, waiting again
    job(
        world,
        queue=world.other_queue,
        state=JobState.RECLAIMED,
        stop_reason="reclaimed",
        workload_type="interactive",
    )
    for hours in (1.5, 0.5):
        ReclaimRecord.objects.create(
            created_at=done,
            kind=ReclaimKind.IDLE_RECLAIM,
            tenant=world.tenant,
            workload_type="interactive",
            gpus=1,
            gpu_hours_freed=hours,
        )
    ReclaimRecord.objects.create(
        created_at=done, kind=ReclaimKind.TIMEOUT, tenant=world.other, workload_type="training"
    )


def test_outcomes_preemptions_and_reclaims_from_the_database(history):
    samples = parse(metrics.database_text())
    nlp = {"pool": "training", "tenant": "nlp"}
    outcomes = {
        ("training", "succeeded", "completed"): 3,
        ("training", "failed", "exit_code"): 2,
        ("evaluation", "failed", "signal"): 1,
        ("training", "cancelled", "not_started"): 1,
        ("training", "timed_out", "timed_out"): 1,
        ("training", "preempted", "preempted"): 1,
    }
    expected = {
        frozenset({**nlp, "workload_type": wt, "outcome": o, "reason": r}.items()): n
        for (wt, o, r), n in outcomes.items()
    }
    expected[
        frozenset(
            {
                "pool": "training",
                "tenant": "vision",
                "workload_type": "interactive",
                "outcome": "reclaimed",
                "reason": "reclaimed",
            }.items()
        )
    ] = 1
    assert of(samples, "sluice_jobs_finished_total") == expected
    assert of(samples, "sluice_job_preemptions_total") == {
        frozenset({**nlp, "workload_type": "training"}.items()): 3
    }
    idle = {"tenant": "nlp", "workload_type": "interactive", "kind": "idle_reclaim"}
    timeout = {"tenant": "vision", "workload_type": "training", "kind": "timeout"}
    assert value(samples, "sluice_reclaims_total", **idle) == 2
    assert value(samples, "sluice_reclaimed_gpu_hours_total", **idle) == 2.0
    assert value(samples, "sluice_reclaims_total", **timeout) == 1
    assert value(samples, "sluice_reclaimed_gpu_hours_total", **timeout) == 0.0


def test_totals_are_served_as_last_counted_until_the_beat_task_recounts(world, history):
    from insights.tasks import metrics_totals

    key = {
        "pool": "training",
        "tenant": "nlp",
        "workload_type": "training",
        "outcome": "succeeded",
        "reason": "completed",
    }
    assert value(parse(metrics.database_text()), "sluice_jobs_finished_total", **key) == 3
    job(world, state=JobState.SUCCEEDED, exit_code=0)
    assert value(parse(metrics.database_text()), "sluice_jobs_finished_total", **key) == 3
    metrics_totals.delay()  # eager in the tests
    samples = parse(metrics.database_text())
    assert value(samples, "sluice_jobs_finished_total", **key) == 4
    assert 0 <= value(samples, "sluice_metrics_totals_age_seconds") < 60


def test_a_refresh_already_running_is_not_doubled(world, history):
    cache.add(metrics.TOTALS_LOCK_KEY, 1, timeout=60)
    try:
        assert metrics.totals_refresh() is None
        assert cache.get(metrics.TOTALS_CACHE_KEY) is None
        # A scrape on a cold cache counts for itself meanwhile.
        assert metrics.totals_get()["outcomes"]
    finally:
        cache.delete(metrics.TOTALS_LOCK_KEY)


def test_scrape_reads_a_constant_number_of_queries(
    world, cluster, client, django_assert_num_queries
):
    # queues, waiting jobs, GPUs, allocations, idle thresholds, quotas, nodes; the totals
    # come from the cache (counted on the first scrape).
    scrape(client)
    with django_assert_num_queries(7):
        first = scrape(client)
    node = world.nodes[1]
    for index in range(8, 12):
        sample(f.GpuFactory(node=node, index=index), 40.0)
    for _ in range(5):
        job(world, state=JobState.SUCCEEDED)
        job(world, queue=world.other_queue, pending_reason_code="WAITING_FOR_GPUS")
    placed(world, list(Gpu.objects.filter(node=node, index__gte=8)))
    with django_assert_num_queries(7):
        second = scrape(client)
    assert len(of(second, "sluice_gpu_allocated")) == len(of(first, "sluice_gpu_allocated")) + 4


def test_every_family_has_help_and_type_and_the_text_parses(cluster, history, client):
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    parse(text)  # the parser refuses what Prometheus would
    for name, kind, _help, _labels in metrics.FAMILIES:
        # 0.0.4 names a counter by its samples' name, _total included (what promtool reads).
        assert f"# TYPE {name} {kind}\n" in text
        assert f"# HELP {name} " in text
    # Every sample belongs to a family with a type and help: a sample the parser could not
    # put under its HELP line comes back as a family of its own, "unknown", with no help.
    families = list(text_string_to_metric_families(text))
    assert families
    for family in families:
        assert family.samples, family.name
        assert family.type != "unknown", family.name
        assert family.documentation, family.name


def test_jobs_that_ran_are_not_counted_as_not_started(world):
    """A job that ended PREEMPTED, RECLAIMED, TIMED_OUT or LOST was stopped that way even
    when no stop reason was recorded (the demo's jobs, rows written by hand); a job
    cancelled after it started was stopped by the cancel; one cancelled while pending never
    started."""
    done = timezone.now()
    ran = {"started_at": done - timedelta(hours=1), "finished_at": done}
    job(world, state=JobState.PREEMPTED, preemption_count=1, **ran)
    job(world, state=JobState.RECLAIMED, **ran)
    job(world, state=JobState.TIMED_OUT, **ran)
    job(world, state=JobState.LOST, **ran)
    job(world, state=JobState.CANCELLED, **ran)
    job(world, state=JobState.CANCELLED, finished_at=done)  # cancelled while pending
    reasons = {
        dict(labels)["outcome"]: (dict(labels)["reason"], n)
        for labels, n in of(parse(metrics.database_text()), "sluice_jobs_finished_total").items()
        if dict(labels)["outcome"] != "cancelled"
    }
    assert reasons == {
        "preempted": ("preempted", 1),
        "reclaimed": ("reclaimed", 1),
        "timed_out": ("timed_out", 1),
        "lost": ("lost", 1),
    }
    cancelled = {
        dict(labels)["reason"]: n
        for labels, n in of(parse(metrics.database_text()), "sluice_jobs_finished_total").items()
        if dict(labels)["outcome"] == "cancelled"
    }
    assert cancelled == {"cancelled": 1, "not_started": 1}


def test_label_values_are_escaped():
    text = metrics.labels_text(("a", "b"), ('say "hi"\\', "two\nlines"))
    assert text == 'a="say \\"hi\\"\\\\",b="two\\nlines"'
    family = metrics.Family("x_things", "gauge", "Things.", ("a", "b"))
    family.add(('say "hi"\\', "two\nlines"), 1.5)
    assert parse(family.render()) == {
        ("x_things", frozenset({"a": 'say "hi"\\', "b": "two\nlines"}.items())): 1.5
    }


def test_the_collector_gives_a_registry_the_same_families(cluster):
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.DatabaseCollector())
    with freeze_time(cluster["now"]):
        theirs = parse(generate_latest(registry).decode())
        ours = parse(metrics.database_text())
    drop = {"sluice_metrics_read_seconds", "sluice_metrics_totals_age_seconds"}
    assert {k: v for k, v in theirs.items() if k[0] not in drop} == {
        k: v for k, v in ours.items() if k[0] not in drop
    }


def test_gc_pause_is_shared_and_restored():
    import gc

    assert gc.isenabled()
    with metrics.gc_paused():
        assert not gc.isenabled()
        with metrics.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with metrics.gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: stays off
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "number, text",
    [
        (3, "3"),
        (0.5, "0.5"),
        (True, "1"),
        (float("nan"), "NaN"),
        (float("inf"), "+Inf"),
        (float("-inf"), "-Inf"),
    ],
)
def test_numbers_in_the_text_format(number, text):
    assert metrics._number(number) == text


def test_promtool_check_metrics_finds_nothing(cluster, history, client):
    """``promtool check metrics`` (Prometheus' own linter) on a scrape: it parses, and
    every metric has help text. One lint is known and kept: the reclaimed GPU-hours counter
    is in hours (GPU-hours are what the pages and chargeback speak), not in seconds.
    Skipped where promtool is not installed (``apt-get install prometheus`` provides it);
    the parser test above checks the help and types always."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus provides it)")
    text = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    report = (done.stdout + done.stderr).decode()
    known = {'sluice_reclaimed_gpu_hours_total use base unit "seconds" instead of "hours"'}
    problems = {line.strip() for line in report.splitlines() if line.strip()} - known
    assert not problems, report
    assert done.returncode in (0, 3), report  # 3: lint findings (the known one); 1: unparsable
