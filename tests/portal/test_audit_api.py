"""``/api/v1/audit-events`` (scoping, filters, read-only) and what each audited action writes."""

import contextlib
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time

from audit.models import AuditEvent
from audit.services import audit_record
from scheduling.choices import JobState, NodeState
from scheduling.models import Quota, TenantRaiseCeiling, WorkloadPolicy
from scheduling.services import config, raises
from scheduling.services.jobs import job_cancel, job_hold, job_release
from scheduling.services.nodes import node_mark_down
from tenants import services as tenant_services
from tenants.models import Membership
from tests import factories as f

URL = "/api/v1/audit-events"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def events(world):
    """One nlp event, one vision event and one platform event (no tenant), an hour apart."""
    with freeze_time(T0):
        viewer = Membership.objects.get(user=world.viewer, tenant=world.tenant)
        tenant_services.membership_change_role(
            actor=world.tenant_admin, membership=viewer, role="member"
        )
    with freeze_time(T0 + timedelta(hours=1)):
        quota = Quota.objects.get(tenant=world.other)
        config.quota_save(actor=world.platform_admin, quota=quota, guaranteed_gpus=4)
    with freeze_time(T0 + timedelta(hours=2)):
        config.pool_save(actor=world.platform_admin, name="inference")
    return {e.action: e for e in AuditEvent.objects.all()}


def listed(api, user, **params):
    response = api(user).get(URL, params)
    assert response.status_code == 200, response.json()
    return [e["action"] for e in response.json()["results"]]


# --- who sees what ---------------------------------------------------------------------------


def test_platform_admin_sees_every_event_newest_first(world, api, events):
    assert listed(api, world.platform_admin) == [
        "pool.create",
        "quota.update",
        "membership.change_role",
    ]


def test_tenant_admin_sees_only_their_tenants_events(world, api, events):
    assert listed(api, world.tenant_admin) == ["membership.change_role"]
    assert listed(api, world.outsider) == ["quota.update"]  # vision's admin


def test_another_tenants_event_and_platform_events_answer_404(world, api, events):
    for action in ("quota.update", "pool.create"):
        response = api(world.tenant_admin).get(f"{URL}/{events[action].pk}")
        assert response.status_code == 404
        assert response.json()["detail"] == "Audit event not found."
    own = api(world.tenant_admin).get(f"{URL}/{events['membership.change_role'].pk}")
    assert own.status_code == 200
    body = own.json()
    assert body["actor"] == "nlp-admin"
    assert body["tenant"] == "nlp"
    assert body["before"] == {"user": "nlp-viewer", "role": "viewer"}
    assert body["after"] == {"user": "nlp-viewer", "role": "member"}
    assert body["hash"] == events["membership.change_role"].hash


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_members_and_viewers_get_403_for_list_and_detail(world, api, events, who):
    user = getattr(world, who)
    response = api(user).get(URL)
    assert response.status_code == 403
    assert "tenant admins and platform admins" in response.json()["detail"]
    event = events["membership.change_role"]
    assert api(user).get(f"{URL}/{event.pk}").status_code == 403


def test_anonymous_is_refused(world, api, events):
    assert api().get(URL).status_code in (401, 403)


def test_the_log_is_read_only_through_the_api(world, api, events):
    event = events["pool.create"]
    client = api(world.platform_admin)
    assert client.post(URL, {"action": "x"}, format="json").status_code == 405
    assert client.put(f"{URL}/{event.pk}", {"reason": "x"}, format="json").status_code == 405
    assert client.patch(f"{URL}/{event.pk}", {"reason": "x"}, format="json").status_code == 405
    assert client.delete(f"{URL}/{event.pk}").status_code == 405
    assert AuditEvent.objects.count() == 3


# --- filters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"since": (T0 + timedelta(minutes=30)).isoformat()}, ["pool.create", "quota.update"]),
        ({"until": (T0 + timedelta(minutes=30)).isoformat()}, ["membership.change_role"]),
        (
            {"since": "2026-12-01T09:30", "until": "2026-12-01T10:30"},
            ["quota.update"],
        ),
        ({"until": "2026-12-01"}, ["pool.create", "quota.update", "membership.change_role"]),
        ({"since": "2026-12-02"}, []),
        ({"actor": "nlp-admin"}, ["membership.change_role"]),
        ({"actor": "root"}, ["pool.create", "quota.update"]),
        ({"action": "quota.update"}, ["quota.update"]),
        ({"action": "membership."}, ["membership.change_role"]),
        ({"action": "quota"}, []),
        ({"tenant": "vision"}, ["quota.update"]),
        ({"target_type": "scheduling.resourcepool"}, ["pool.create"]),
    ],
)
def test_filters(world, api, events, params, expected):
    assert listed(api, world.platform_admin, **params) == expected


def test_target_id_filter(world, api, events):
    quota = events["quota.update"]

    found = listed(
        api, world.platform_admin, target_type=quota.target_type, target_id=quota.target_id
    )

    assert found == ["quota.update"]


def test_filters_never_widen_a_tenant_admins_scope(world, api, events):
    assert listed(api, world.tenant_admin, tenant="vision") == []
    assert listed(api, world.tenant_admin, action="pool.create") == []


def test_a_bad_time_is_a_400_naming_the_field(world, api, events):
    response = api(world.platform_admin).get(URL, {"since": "yesterday"})

    assert response.status_code == 400
    assert "since" in response.json()["errors"]


def test_list_is_paginated_and_its_query_count_is_flat(world, api, events):
    def queries():
        with CaptureQueriesContext(connection) as ctx:
            response = api(world.platform_admin).get(URL, {"page_size": 2})
        assert response.status_code == 200
        return response.json(), len(ctx.captured_queries)

    page, few = queries()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    for n in range(10):
        audit_record(action="test.note", target_type="thing", target_id=n, tenant=world.tenant)
    page, many = queries()
    assert page["count"] == 13
    assert many == few


# --- every audited action writes exactly one event with the right before and after --------


@contextlib.contextmanager
def one_new_event():
    """Collects the events written inside the block; exactly one is expected."""
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    box: dict = {}
    yield box
    new = list(AuditEvent.objects.filter(id__gt=last).order_by("id"))
    assert len(new) == 1, [e.action for e in new]
    box["event"] = new[0]


@contextlib.contextmanager
def no_new_event():
    count = AuditEvent.objects.count()
    yield
    assert AuditEvent.objects.count() == count


def assert_one(action, run, *, actor, before=None, after=None, tenant=None):
    with one_new_event() as box:
        run()
    event = box["event"]
    assert event.action == action
    assert event.actor == actor
    assert event.tenant == tenant
    assert event.hash == event.compute_hash()
    for key, value in (before or {}).items():
        assert event.before[key] == value, (key, event.before)
    for key, value in (after or {}).items():
        assert event.after[key] == value, (key, event.after)
    return event


def test_user_changes_write_one_event_each(world):
    root = world.platform_admin
    created = {}

    def create():
        created["user"] = tenant_services.user_create(
            actor=root, username="new.user", password="a-long-enough-passphrase-42"
        )

    assert_one("user.create", create, actor=root, after={"username": "new.user"})
    assert_one(
        "user.update",
        lambda: tenant_services.user_update(actor=root, user=world.member, first_name="Ann"),
        actor=root,
        before={"first_name": ""},
        after={"first_name": "Ann"},
    )
    assert_one(
        "user.deactivate",
        lambda: tenant_services.user_deactivate(actor=root, user=world.viewer),
        actor=root,
        before={"is_active": True},
        after={"is_active": False},
    )
    newcomer = created["user"]
    assert_one(
        "membership.add",
        lambda: tenant_services.membership_add(
            actor=world.tenant_admin, tenant=world.tenant, user=newcomer, role="viewer"
        ),
        actor=world.tenant_admin,
        tenant=world.tenant,
        after={"user": "new.user", "role": "viewer"},
    )
    membership = Membership.objects.get(user=newcomer)
    assert_one(
        "membership.change_role",
        lambda: tenant_services.membership_change_role(
            actor=world.tenant_admin, membership=membership, role="member"
        ),
        actor=world.tenant_admin,
        tenant=world.tenant,
        before={"role": "viewer"},
        after={"role": "member"},
    )
    event = assert_one(
        "membership.remove",
        lambda: tenant_services.membership_remove(
            actor=world.tenant_admin, membership=Membership.objects.get(user=newcomer)
        ),
        actor=world.tenant_admin,
        tenant=world.tenant,
        before={"user": "new.user", "role": "member"},
    )
    assert event.after is None


def test_configuration_changes_write_one_event_each(world):
    root = world.platform_admin
    quota = Quota.objects.get(tenant=world.tenant)
    assert_one(
        "quota.update",
        lambda: config.quota_save(actor=root, quota=quota, guaranteed_gpus=4),
        actor=root,
        tenant=world.tenant,
        before={"guaranteed_gpus": 8},
        after={"guaranteed_gpus": 4},
    )
    assert_one(
        "queue.update",
        lambda: config.queue_save(actor=world.tenant_admin, queue=world.queue, strict_fifo=True),
        actor=world.tenant_admin,
        tenant=world.tenant,
        before={"strict_fifo": False},
        after={"strict_fifo": True},
    )
    assert_one(
        "pool.update",
        lambda: config.pool_save(actor=root, pool=world.pool, description="big iron"),
        actor=root,
        before={"description": ""},
        after={"description": "big iron"},
    )
    assert_one(
        "priority_class.update",
        lambda: config.priority_class_save(
            actor=root, priority_class=world.high, max_grant_hours=8
        ),
        actor=root,
        before={"max_grant_hours": 24},
        after={"max_grant_hours": 8},
    )
    policy = WorkloadPolicy.objects.get(workload_type="training")
    assert_one(
        "policy.update",
        lambda: config.workload_policy_save(actor=root, policy=policy, stop_grace_seconds=60),
        actor=root,
        before={"stop_grace_seconds": 5},
        after={"stop_grace_seconds": 60},
    )
    assert_one(
        "tenant.raise_ceiling",
        lambda: raises.tenant_raise_ceiling_set(
            actor=root, tenant=world.tenant, ceiling=world.high
        ),
        actor=root,
        tenant=world.tenant,
        before={"ceiling": None},
        after={"ceiling": "high"},
    )


def test_job_steps_by_someone_other_than_the_owner_write_one_event_each(world, dispatch_requests):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    admin = world.tenant_admin
    assert_one(
        "job.hold",
        lambda: job_hold(user=admin, job=job),
        actor=admin,
        tenant=world.tenant,
        before={"state": "PENDING"},
        after={"state": "HELD"},
    )
    assert_one(
        "job.release",
        lambda: job_release(user=admin, job=job),
        actor=admin,
        tenant=world.tenant,
        before={"state": "HELD"},
        after={"state": "PENDING"},
    )
    assert_one(
        "job.cancel",
        lambda: job_cancel(user=admin, job=job, reason="duplicate"),
        actor=admin,
        tenant=world.tenant,
        before={"state": "PENDING"},
        after={"state": "CANCELLED"},
    )
    own = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    with no_new_event():
        job_cancel(user=world.member, job=own)  # the owner's own step is not audited


def test_node_down_writes_one_event(world):
    node = world.nodes[0]
    gpus = list(node.gpus.order_by("index")[:2])
    job = f.placed_job(
        gpus=gpus, queue=world.queue, project=world.project, submitted_by=world.member
    )

    event = assert_one(
        "node.down",
        lambda: node_mark_down(node=node, reason="no heartbeat"),
        actor=None,
        before={"state": NodeState.READY},
        after={"state": NodeState.DOWN, "jobs": [job.pk]},
    )
    assert event.reason == "no heartbeat"


def test_raise_steps_write_one_event_each(world):
    TenantRaiseCeiling.objects.create(tenant=world.tenant, ceiling=world.high)
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    holder = {}

    def request():
        holder["raise"] = raises.priority_raise_request(
            user=world.member, job=job, to_class=world.high, reason="demo"
        )

    assert_one(
        "priority_raise.request",
        request,
        actor=world.member,
        tenant=world.tenant,
        after={"state": "pending", "to_class": "high"},
    )
    raise_ = holder["raise"]
    assert_one(
        "priority_raise.approve",
        lambda: raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin),
        actor=world.tenant_admin,
        tenant=world.tenant,
        before={"state": "pending"},
        after={"state": "approved", "jobs": [{"job": job.pk, "from": "normal", "to": "high"}]},
    )
    assert_one(
        "priority_raise.revoke",
        lambda: raises.priority_raise_revoke(raise_=raise_, user=world.tenant_admin),
        actor=world.tenant_admin,
        tenant=world.tenant,
        before={"state": "approved"},
        after={"state": "revoked", "jobs": [{"job": job.pk, "from": "high", "to": "normal"}]},
    )


def test_a_preemption_writes_one_event(world, dispatch_requests, settings):
    """A job raised to a class that may preempt takes the GPUs of a lower, preemptible one."""
    settings.SLUICE_PREEMPTION_MIN_GAIN_SECONDS = 0  # any gain: the victim runs an hour
    from scheduling.services.dispatch import dispatch_cycle

    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=16)
    node1, node2 = (list(n.gpus.order_by("index")) for n in world.nodes)
    f.placed_job(gpus=node1, queue=world.queue, project=world.project, submitted_by=world.member)
    victim = f.placed_job(
        gpus=node2,
        queue=world.other_queue,
        project=world.other_project,
        submitted_by=world.outsider,
        base_priority_class=world.low,
        priority_class=world.low,
    )
    waiting = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, gpus_per_node=8
    )
    TenantRaiseCeiling.objects.create(tenant=world.tenant, ceiling=world.high)
    raise_ = raises.priority_raise_request(
        user=world.member, job=waiting, to_class=world.high, reason="launch"
    )
    raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)

    event = assert_one(
        "job.preempt",
        dispatch_cycle,
        actor=None,
        tenant=world.other,
        before={"state": "RUNNING"},
        after={"state": "STOPPING", "preemptor": waiting.pk, "kind": "priority"},
    )
    assert event.target_id == str(victim.pk)
    victim.refresh_from_db()
    assert victim.state == JobState.STOPPING


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("until", "9999-12-31"),  # the whole day would end past the calendar
        ("since", "9999-12-31T23:59:59-12:00"),  # past the calendar in UTC
        ("until", "0001-01-01T00:00:00+14:00"),  # before it in UTC
    ],
)
def test_moments_at_the_edge_of_the_calendar_are_a_400_naming_the_filter(
    world, api, events, param, value
):
    response = api(world.platform_admin).get(URL, {param: value})

    assert response.status_code == 400, response.content
    assert param in response.json()["errors"]


def test_an_offset_postgresql_would_refuse_is_read_in_utc(world, api, events):
    response = api(world.platform_admin).get(URL, {"until": "2846-04-09T03:40:43-20:08"})

    assert response.status_code == 200, response.content
    assert response.json()["count"] == AuditEvent.objects.count() >= len(events)
