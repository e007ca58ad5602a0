"""The insights page: numbers of the ranked tables from hand-made history, scoping by role,
periods and the empty state."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from scheduling.choices import JobState, PoolPurpose, ReclaimKind, WorkloadType
from tests import factories as f
from tests.insights import insights_helpers as h

pytestmark = pytest.mark.django_db


def chart(body: str, chart_id: str) -> dict:
    found = re.search(
        rf'<script id="{chart_id}" type="application/json">(.*?)</script>', body, re.S
    )
    assert found, f"no chart {chart_id}"
    return json.loads(found.group(1))


def table(body: str, table_id: str) -> str:
    found = re.search(rf'<table[^>]*id="{table_id}".*?</table>', body, re.S)
    assert found, f"no table {table_id}"
    return found.group(0)


def rows(body: str, table_id: str) -> list[str]:
    tbody = table(body, table_id).split("<tbody>")[1]
    return [
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", r)).strip() for r in tbody.split("</tr>")[:-1]
    ]


@pytest.fixture
def history(world):
    """Two tenants' queues: nlp waits 40 min at p95 (target 30 min), vision 10 min."""
    now = timezone.now()
    f.policy(WorkloadType.TRAINING, max_wait_seconds=1800)
    world.queue.allowed_workload_types = [WorkloadType.TRAINING]
    world.queue.save()
    world.other_queue.allowed_workload_types = [WorkloadType.TRAINING]
    world.other_queue.save()
    h.queue_hours(world.queue, now, 10, p50=600, p95=2400, admitted=3, depth=4.0, wait_max=3000)
    h.queue_hours(world.other_queue, now, 10, p50=120, p95=600, admitted=1, depth=1.0)
    h.usage_hours(world.pool, now, 10, capacity=16, allocated=10, used=5, idle=4)
    h.usage_hours(world.pool, now, 10, tenant=world.tenant, capacity=8, allocated=8, used=3, idle=4)
    h.usage_hours(world.pool, now, 10, tenant=world.other, capacity=8, allocated=2, used=2, idle=0)
    return now


def get(client, user, url="/insights/"):
    client.force_login(user)
    response = client.get(url)
    return response, response.content.decode()


def test_members_and_viewers_get_403(world, client):
    for user in (world.member, world.viewer):
        response, body = get(client, user)
        assert response.status_code == 403
        assert "tenant admins" in body


def test_anonymous_is_sent_to_log_in(client):
    response = client.get("/insights/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_platform_admin_sees_queues_ranked_by_p95_against_target(world, client, history):
    response, body = get(client, world.platform_admin)

    assert response.status_code == 200
    waits = rows(body, "table-waits")
    assert waits[0].startswith("1 nlp/train training 30 10 min 40 min 50 min 30 min 133 %")
    assert waits[1].startswith("2 vision/train training 10 2 min 10 min 10 min 30 min 33 %")
    assert f'href="/queues/{world.queue.pk}/"' in table(body, "table-waits")
    wait = chart(body, "chart-wait")
    labels = [d["label"] for d in wait["data"]["datasets"]]
    assert labels[:2] == ["nlp/train p95", "nlp/train p50"]
    assert 2400.0 in wait["data"]["datasets"][0]["data"]
    depth = chart(body, "chart-depth")
    assert depth["data"]["datasets"][0]["label"] == "nlp/train"
    assert 4.0 in depth["data"]["datasets"][0]["data"]


def test_tenant_admin_sees_only_their_tenant(world, client, history):
    h.ended_job(world.other_queue, world.other_project, world.outsider, command=["vision-secret"])
    response, body = get(client, world.tenant_admin)

    assert response.status_code == 200
    assert "nlp/train" in body
    assert "vision/train" not in body and "vision-secret" not in body
    assert [d["label"] for d in chart(body, "chart-wait")["data"]["datasets"]] == [
        "nlp/train p95",
        "nlp/train p50",
    ]
    # pool totals are every tenant's together
    pool_chart = chart(body, f"chart-pool-{world.pool.pk}")
    assert 10.0 in pool_chart["data"]["datasets"][1]["data"]
    assert chart(body, "chart-tenants")["data"]["labels"] == ["nlp"]


def test_vision_admin_never_sees_nlp(world, client, history):
    h.ended_job(world.queue, world.project, world.member, command=["nlp-secret"])
    response, body = get(client, world.outsider)

    assert response.status_code == 200
    assert "vision/train" in body
    assert "nlp/train" not in body and "nlp-secret" not in body
    assert ">nlp<" not in body and "/quotas/nlp/" not in body


def test_teams_ranked_by_abnormal_use(world, client, history):
    response, body = get(client, world.platform_admin)

    # The last 10 h recorded, in a week: means are the GPU-hours over the period's hours
    # (from its start to the last record), the hours before the first record held nothing.
    span = response.context["coverage"].span
    assert response.context["coverage"].recorded == 10 and 160 < span <= 168
    teams = rows(body, "table-teams")
    # nlp: 80 GPU-h held, 40 idle, 30 used; vision: 20 GPU-h of a guarantee of 8 GPUs.
    assert teams[0] == (
        f"1 vision training {20 / span:.1f} {20 / span:.1f} 0.0 8 0.0 {8 * span - 20:.1f} "
        f"uses {20 / span / 8:.0%} of its guarantee"
    )
    assert teams[1] == (
        f"2 nlp training {80 / span:.1f} {30 / span:.1f} {40 / span:.1f} 8 40.0 "
        f"{8 * span - 80:.1f} 50% of its GPUs held idle; uses {80 / span / 8:.0%} of its guarantee"
    )
    assert "/quotas/vision/" in table(body, "table-teams")
    tenants = chart(body, "chart-tenants")
    assert tenants["data"]["labels"] == ["nlp", "vision"]
    assert tenants["data"]["datasets"][0]["data"] == [round(80 / span, 2), round(20 / span, 2)]
    assert tenants["data"]["datasets"][3]["data"] == [8, 8]


def stat(body: str, stat_id: str) -> str:
    found = re.search(rf'<div class="stat" id="{stat_id}">(.*?)</div>', body, re.S)
    assert found, f"no stat {stat_id}"
    return found.group(1).strip()


def test_the_30_day_mean_is_over_30_days_not_over_the_week_recorded(world, client):
    """A week recorded (9.4 GPUs of 24 held every hour, 1,579 GPU-h): the 7-day card says
    9.4 / 24, the 30-day card the same GPU-hours over its 30 days, 2.2 / 24, and says how
    much of the period the history covers."""
    with freeze_time("2026-03-04 10:30:00"):
        now = timezone.now()
        h.usage_hours(world.pool, now, 168, capacity=24, allocated=9.4, used=4.7, idle=0)
        h.usage_hours(
            world.pool, now, 168, tenant=world.tenant, capacity=8, allocated=9.4, used=4.7, idle=0
        )
        response, week = get(client, world.platform_admin, "/insights/?period=7d")
        assert stat(week, "stat-allocated") == "9.4 / 24"
        assert 'id="stat-coverage"' not in week
        response, month = get(client, world.platform_admin, "/insights/?period=30d")
    # 30 days from 2 Feb 12:00 to the last hour recorded (4 Mar 09:00): 718 hours.
    assert stat(month, "stat-allocated") == f"{168 * 9.4 / 718:.1f} / 24" == "2.2 / 24"
    assert response.context["coverage"].span == 718
    assert "History recorded for 7.0 of 30 days" in month
    (nlp,) = [r for r in rows(month, "table-teams") if " nlp training " in r]
    assert " nlp training 2.2 1.1 0.0 8 " in nlp


def test_failing_commands_projects_and_exit_codes(world, client):
    now = timezone.now()
    for _ in range(3):
        h.ended_job(
            world.queue, world.project, world.member, exit_code=2, command=["python", "bad.py"]
        )
    h.ended_job(
        world.queue, world.project, world.member, exit_code=137, command=["python", "oom.py"]
    )
    for _ in range(4):
        h.ended_job(world.queue, world.project, world.member, state=JobState.SUCCEEDED, exit_code=0)
    h.ended_job(
        world.queue,
        world.project,
        world.member,
        exit_code=2,
        command=["python", "old.py"],
        finished_ago=timedelta(days=9),
    )
    h.ended_job(world.other_queue, world.other_project, world.outsider, exit_code=2)

    _, body = get(client, world.tenant_admin)

    commands = rows(body, "table-commands")
    assert commands[0].startswith("1 nlp/llm python bad.py 2 3 job")
    assert commands[1].startswith("2 nlp/llm python oom.py 137 1 job")
    assert len(commands) == 2  # old.py ended before the period; vision's is not nlp's
    assert f"/jobs/?state=FAILED&amp;project={world.project.pk}&amp;since=7d" in body
    assert rows(body, "table-exits") == ["1 code 2 3 1", "2 code 137 1 1"]
    assert rows(body, "table-fail-projects") == ["nlp/llm 4 / 8 50 %"]
    assert chart(body, "chart-fail-project")["data"]["datasets"][0]["data"] == [50.0]
    assert chart(body, "chart-fail-type")["data"]["labels"] == ["Training"]
    assert ">4 / 8<" in body  # failed / ended
    del now


def started_ago(job, ago: timedelta):
    """``job`` (placed now) granted its GPUs and started ``ago`` earlier."""
    from scheduling.models import Allocation, Job

    at = timezone.now() - ago
    Job.objects.filter(pk=job.pk).update(admitted_at=at, started_at=at)
    Allocation.objects.filter(job=job).update(granted_at=at)


def test_idle_gpus_longest_first_and_scoped(world, client):
    now = timezone.now()
    g1, g2, g3 = (world.nodes[0].gpus.get(index=i) for i in (0, 1, 2))
    nlp_job = f.placed_job(
        gpus=[g1], queue=world.queue, project=world.project, submitted_by=world.member
    )
    vision_job = f.placed_job(
        gpus=[g2], queue=world.other_queue, project=world.other_project, submitted_by=world.outsider
    )
    started_ago(nlp_job, timedelta(days=1))
    started_ago(vision_job, timedelta(days=1))
    h.idle_gpu(g1, now, idle_for=timedelta(hours=5))
    h.idle_gpu(g2, now, idle_for=timedelta(hours=9))
    h.idle_gpu(g3, now, idle_for=timedelta(days=2), busy=False)

    _, admin_body = get(client, world.platform_admin)
    idle = rows(admin_body, "table-idle")
    assert idle[0].startswith("1 gpu-01:2 training")
    assert "2 d" in idle[0] and "(never busy)" in idle[0] and "nobody" in idle[0]
    assert idle[1].startswith("2 gpu-01:1") and "9 h" in idle[1] and "vision" in idle[1]
    assert idle[2].startswith("3 gpu-01:0") and "5 h" in idle[2]
    assert chart(admin_body, "chart-idle")["data"]["datasets"][0]["data"] == [48.0, 9.0, 5.0]

    _, nlp_body = get(client, world.tenant_admin)
    idle = rows(nlp_body, "table-idle")
    assert len(idle) == 1 and idle[0].startswith("1 gpu-01:0")
    assert 'href="/nodes/#node-gpu-01"' in table(nlp_body, "table-idle")


def test_a_held_gpu_is_idle_at_most_since_its_job_started(world, client):
    """A GPU idle (and never busy) for 16 minutes, taken by a job 2 minutes ago: idle for
    2 minutes, not busy since the job started; one busy until the job's start an hour ago
    and idle since then: an hour. A GPU nobody holds keeps its own idle time."""
    now = timezone.now()
    g1, g2, g3 = (world.nodes[0].gpus.get(index=i) for i in (0, 1, 2))
    fresh = f.placed_job(
        gpus=[g1], queue=world.queue, project=world.project, submitted_by=world.member
    )
    started_ago(fresh, timedelta(minutes=2))
    h.idle_gpu(g1, now, idle_for=timedelta(minutes=16), busy=False)
    older = f.placed_job(
        gpus=[g2], queue=world.queue, project=world.project, submitted_by=world.member
    )
    started_ago(older, timedelta(hours=1))
    h.idle_gpu(g2, now, idle_for=timedelta(hours=3))  # last busy under the previous job
    h.idle_gpu(g3, now, idle_for=timedelta(minutes=16), busy=False)

    _, body = get(client, world.platform_admin)
    idle = rows(body, "table-idle")
    assert idle[0].startswith("1 gpu-01:1") and "1 h" in idle[0]
    assert "(not busy since the job started)" in idle[0]
    assert idle[1].startswith("2 gpu-01:2") and "16 min" in idle[1] and "(never busy)" in idle[1]
    assert idle[2].startswith("3 gpu-01:0") and "2 min" in idle[2] and "16 min" not in idle[2]
    assert "(not busy since the job started)" in idle[2]
    hours = chart(body, "chart-idle")["data"]["datasets"][0]["data"]
    assert hours == [1.0, 0.3, 0.0]


def test_reclaimed_and_preempted_gpu_hours(world, client):
    now = timezone.now()
    h.reclaim(world.tenant, now, gpu_hours=6.5)
    h.reclaim(world.tenant, now, kind=ReclaimKind.TIMEOUT, gpu_hours=0.0)
    h.reclaim(world.tenant, now, kind=ReclaimKind.PREEMPTION_REQUEUE, gpu_hours=2.0)
    h.reclaim(world.other, now, gpu_hours=100.0)
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    h.preemption_event(job, now)

    _, body = get(client, world.tenant_admin)

    assert rows(body, "table-recoveries") == [
        "Idle reclaim 1 6.5",
        "Preemption requeue 1 2.0",
        "Runtime limit 1 0.0",
        "Preemptions started 1 —",
    ]
    assert 'id="stat-reclaimed">6.5<' in body
    recovery = chart(body, "chart-recovery")
    assert sum(sum(d["data"]) for d in recovery["data"]["datasets"]) == 8.5


def test_reclaims_over_time_are_cut_at_utc_days_whatever_the_time_zone(world, client, settings):
    # 20:00 UTC on the 15th is the 16th in Tokyo: the chart's days are UTC, as the page's.
    settings.TIME_ZONE = "Asia/Tokyo"
    with freeze_time("2026-11-17 12:00:00"):
        h.reclaim(world.tenant, timezone.now(), gpu_hours=6.5, ago=timedelta(hours=40))
        _, body = get(client, world.tenant_admin)

    recovery = chart(body, "chart-recovery")
    assert recovery["data"]["labels"] == ["15 Nov"]
    # the window it states is UTC too
    assert "to 2026-11-17 12:00 UTC" in body


def test_inference_pools_near_capacity(world, client):
    now = timezone.now()
    pool = f.PoolFactory(name="serving", purpose=PoolPurpose.INFERENCE)
    f.QuotaFactory(tenant=world.tenant, pool=pool, guaranteed_gpus=4, borrow_limit_gpus=1)
    h.usage_hours(pool, now, 5, capacity=10, allocated=9, used=8, idle=0)
    h.usage_hours(pool, now, 5, tenant=world.tenant, capacity=4, allocated=5, used=4, idle=0)
    h.usage_hours(pool, now, 5, tenant=world.other, capacity=0, allocated=4, used=4, idle=0)

    response, body = get(client, world.tenant_admin)

    span = response.context["coverage"].span  # 5 h recorded in a week: means over the week
    inference = rows(body, "table-inference")
    assert inference[0] == f"1 serving nlp {25 / span:.1f} 5 5 100 %"
    assert inference[1] == f"2 serving whole pool {45 / span:.1f} 9 10 90 %"
    assert len(inference) == 2  # vision's quota is not nlp's business
    assert "Services near capacity now: " in body  # the services part comes first


def test_24h_reads_minute_rows_and_7d_hour_rows(world, client):
    now = timezone.now()
    h.queue_minutes(world.queue, now, 30, p95=90)

    _, day = get(client, world.platform_admin, "/insights/?period=24h")
    assert rows(day, "table-waits")[0].startswith("1 nlp/train training 30 45 s 1 min 30 s")
    assert len(chart(day, "chart-wait")["data"]["labels"]) == 96

    _, week = get(client, world.platform_admin, "/insights/?period=7d")
    assert 'id="insights-empty"' in week
    assert "No queue history in this period." in week
    assert 'data-chart="chart-wait"' not in week


def test_bad_period_falls_back_with_a_message(world, client, history):
    response, body = get(client, world.platform_admin, "/insights/?period=forever")

    assert response.status_code == 200
    assert 'id="period-error"' in body and "Unknown period" in body
    assert 'id="period-7d" aria-current="page"' in body or (
        'class="period-tab active" id="period-7d"' in body
    )
    assert "nlp/train" in body


def test_empty_installation_shows_a_helpful_state(world, client):
    response, body = get(client, world.platform_admin)

    assert response.status_code == 200
    assert 'id="insights-empty"' in body
    assert "data-chart=" not in body


def _grow(world, now, k, first):
    """More history of every kind: ``k`` more queues with rows, failed jobs, reclaims, idle
    GPUs, and a pool with its rows (queues, GPUs and pools numbered from ``first``)."""
    pool = f.PoolFactory(name=f"pool{first}")
    f.QuotaFactory(tenant=world.tenant, pool=pool, guaranteed_gpus=4)
    h.usage_hours(pool, now, 20 * k, capacity=16, allocated=8, used=4, idle=2)
    h.usage_hours(pool, now, 20 * k, tenant=world.tenant, capacity=4, allocated=8, used=4, idle=2)
    for i in range(first, first + k):
        queue = f.QueueFactory(
            tenant=world.tenant if i % 2 else world.other,
            name=f"q{i}",
            pool=world.pool,
            default_priority_class=world.normal,
            max_self_service_class=world.normal,
        )
        h.queue_hours(queue, now, 20, p50=60 * i, p95=120 * i)
        project = world.project if i % 2 else world.other_project
        job = h.ended_job(queue, project, world.member, exit_code=i, command=["run", str(i)])
        h.ended_job(queue, project, world.member, state=JobState.SUCCEEDED, exit_code=0)
        h.reclaim(queue.tenant, now, gpu_hours=i)
        h.preemption_event(job, now)
        gpu = world.nodes[1].gpus.get(index=i)
        f.placed_job(gpus=[gpu], queue=queue, project=project, submitted_by=world.member)
        h.idle_gpu(gpu, now, idle_for=timedelta(hours=i + 1))


@pytest.mark.parametrize("user", ["platform_admin", "tenant_admin"])
def test_query_count_does_not_grow_with_history(world, client, user):
    now = timezone.now()
    client.force_login(getattr(world, user))
    _grow(world, now, 2, first=0)
    client.get("/insights/")  # warm caches (content types, sessions)
    with CaptureQueriesContext(connection) as small:
        assert client.get("/insights/").status_code == 200
    _grow(world, now, 6, first=2)
    with CaptureQueriesContext(connection) as large:
        assert client.get("/insights/").status_code == 200

    assert len(large) == len(small), [q["sql"][:120] for q in large.captured_queries]


def test_the_day_view_reads_hour_rows_until_minute_rows_cover_the_day(client, world):
    # A fresh install: the backfill wrote hour rows, the writer a few minutes so far.
    from insights.choices import Resolution
    from insights.models import UsageRollup

    now = timezone.now().replace(second=0, microsecond=0)
    for hours_ago in range(1, 10):
        UsageRollup.objects.create(
            resolution=Resolution.HOUR,
            bucket=now.replace(minute=0) - timedelta(hours=hours_ago),
            pool=world.pool,
            gpu_model="H100-80GB",
            capacity_gpus=16,
            allocated_gpus=4,
        )
    UsageRollup.objects.create(
        resolution=Resolution.MINUTE,
        bucket=now - timedelta(minutes=2),
        pool=world.pool,
        gpu_model="H100-80GB",
        capacity_gpus=16,
        allocated_gpus=8,
    )
    client.force_login(world.platform_admin)
    page = client.get("/insights/?period=24h")
    assert page.context["window"].period.resolution == Resolution.HOUR
    assert "hourly history" in page.content.decode()
    # Once the minute rows reach back a day, they are read.
    UsageRollup.objects.create(
        resolution=Resolution.MINUTE,
        bucket=now - timedelta(hours=23, minutes=50),
        pool=world.pool,
        gpu_model="H100-80GB",
        capacity_gpus=16,
    )
    page = client.get("/insights/?period=24h")
    assert page.context["window"].period.resolution == Resolution.MINUTE
