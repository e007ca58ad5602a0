"""Pages people use every day: live parts, durations, the GPU model list, submit again,
the jobs list's filters, sorting and bulk steps, allocations per node, node removal."""

import io
import logging

import pytest
from django.core.management import call_command

from audit.models import AuditEvent
from scheduling.choices import JobState, NodeState, RaiseState
from scheduling.forms import format_duration, parse_duration
from scheduling.models import Job, JobEvent, Node, PriorityRaise, TenantRaiseCeiling
from scheduling.services.config import NODE_RETIRED_LABEL
from tests import factories as f
from tests.scheduling.test_list_query_counts import assert_constant

from .test_job_pages import form


@pytest.fixture
def member_client(world, client):
    client.force_login(world.member)
    return client


def own(world, **fields):
    return f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, **fields
    )


HTMX = {"HTTP_HX_REQUEST": "true"}


# --- live parts -------------------------------------------------------------------------------


def test_job_live_part_polls_while_the_job_has_not_ended(world, member_client):
    job = own(world, pending_reason_code="WAITING_FOR_GPUS", pending_reason_message="0 free")

    body = member_client.get(f"/jobs/{job.pk}/live", **HTMX).content.decode()

    assert body.startswith('<div id="job-live"')
    assert f'hx-get="/jobs/{job.pk}/live" hx-trigger="every 2s"' in body
    assert "WAITING_FOR_GPUS" in body
    assert "<html" not in body  # the part only


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
def test_job_live_part_stops_polling_once_the_job_has_ended(world, member_client, state):
    job = own(world, state=state)

    body = member_client.get(f"/jobs/{job.pk}/live", **HTMX).content.decode()

    assert f'id="job-state">{state}' in body
    assert "hx-trigger" not in body


def test_job_live_part_of_another_tenant_is_404(world, client):
    job = own(world)
    client.force_login(world.outsider)

    assert client.get(f"/jobs/{job.pk}/live", **HTMX).status_code == 404


@pytest.mark.parametrize(
    ("url", "part"),
    [
        ("/jobs/", 'id="jobs-live"'),
        ("/", 'id="dashboard-live"'),
        ("/approvals/", 'id="approvals-live"'),
    ],
)
def test_list_pages_answer_htmx_with_their_live_part_only(world, client, url, part):
    client.force_login(world.tenant_admin)
    own(world, name="listed-job")

    page = client.get(url).content.decode()
    live = client.get(url, **HTMX).content.decode()

    assert part in page and "<html" in page
    assert live.lstrip().startswith(f"<div {part}")
    assert "<html" not in live
    assert 'hx-trigger="every' in live


def test_queue_page_live_part(world, member_client):
    own(world, name="queued-one", pending_rank=1.0)

    live = member_client.get(f"/queues/{world.queue.pk}/", **HTMX).content.decode()

    assert 'id="queue-live"' in live and "queued-one" in live and "<html" not in live


@pytest.mark.parametrize("url", ["/jobs/", "/jobs/?mine=&sort=-name", "/"])
def test_live_parts_keep_a_constant_query_count(world, client, url):
    client.force_login(world.member)

    assert_constant(world, lambda: client.get(url, **HTMX))


def test_job_live_part_query_count_does_not_grow_with_gpus(world, member_client):
    from tests.scheduling.test_list_query_counts import count_queries

    small_job = f.placed_job(
        gpus=list(world.nodes[0].gpus.all()[:1]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )
    big_job = f.placed_job(
        gpus=list(world.nodes[1].gpus.all()[:8]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )

    small = count_queries(lambda: member_client.get(f"/jobs/{small_job.pk}/live", **HTMX))
    big = count_queries(lambda: member_client.get(f"/jobs/{big_job.pk}/live", **HTMX))

    assert small == big


# --- allocations per node ---------------------------------------------------------------------


def test_allocations_are_one_row_per_node(world, member_client):
    gpus = list(world.nodes[0].gpus.all()[:4])
    job = f.placed_job(
        gpus=gpus, queue=world.queue, project=world.project, submitted_by=world.member
    )

    body = member_client.get(f"/jobs/{job.pk}/").content.decode()

    assert body.count('class="allocation"') == 1
    assert "4 × <span" in body
    assert world.nodes[0].name in body


# --- durations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2h30m", 9000),
        ("90m", 5400),
        ("3600", 3600),
        ("1d", 86400),
        ("1d 12h", 129600),
        ("45s", 45),
        ("90min", 5400),
        ("1.5h", 5400),
        ("2H", 7200),
    ],
)
def test_durations_are_typed_like_people_say_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "2x", "h2", "2h30q", "-5m"])
def test_what_is_not_a_duration(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(9000, "2h30m"), (259200, "3d"), (45, "45s"), (90061, "1d1h1m1s")]
)
def test_durations_are_shown_compactly(seconds, text):
    assert format_duration(seconds) == text


def test_submit_form_takes_a_typed_duration(world, member_client, dispatch_requests):
    member_client.post("/jobs/new/", form(world, max_runtime_seconds="1h30m"))

    assert Job.objects.get().max_runtime_seconds == 5400


def test_submit_form_refuses_a_duration_it_cannot_read(world, member_client):
    response = member_client.post("/jobs/new/", form(world, max_runtime_seconds="soon"))

    assert "2h30m" in " ".join(response.context["form"].errors["max_runtime_seconds"])
    assert not Job.objects.exists()


def test_submit_page_has_human_labels_and_compact_policy_durations(world, member_client):
    body = member_client.get("/jobs/new/").content.decode()

    assert ">GPUs per node:</label>" in body
    assert ">Maximum runtime:</label>" in body
    assert ">GPU model:</label>" in body
    assert "Gpus per node" not in body and "Max runtime seconds" not in body
    assert "<td>1h / 1d</td>" in body  # the test world's training policy: 3600 s / 86400 s
    assert " s / " not in body


def test_gpu_model_is_chosen_from_the_models_of_the_queues_pool(world, member_client):
    other_pool = f.PoolFactory(name="elsewhere")
    node = f.NodeFactory(name="elsewhere-01", pool=other_pool)
    f.GpuFactory(node=node, index=0, uuid="GPU-elsewhere-0", model="L4-24GB")

    body = member_client.get("/jobs/new/").content.decode()

    models = {g.model for g in world.nodes[0].gpus.all()}
    for model in models:
        assert f'value="{model}" data-pools="{world.pool.pk}" data-per-node="8"' in body
    assert "L4-24GB" not in body  # a pool none of the member's queues uses
    assert f'value="{world.queue.pk}" data-pool="{world.pool.pk}"' in body


def test_submit_again_fills_the_form_from_a_job(world, member_client):
    job = own(
        world,
        name="bert-v1",
        command=["python", "train.py", "--note", "two words"],
        env={"EPOCHS": "3"},
        gpus_per_node=4,
        max_runtime_seconds=9000,
    )

    response = member_client.get(f"/jobs/new/?from={job.pk}")

    initial = response.context["form"].initial
    assert initial["name"] == "bert-v1"
    assert initial["command"] == "python train.py --note 'two words'"
    assert initial["env"] == "EPOCHS=3"
    assert initial["gpus_per_node"] == 4
    body = response.content.decode()
    assert 'value="2h30m"' in body
    assert 'id="resubmit-note"' in body


def test_submit_again_from_another_tenants_job_fills_nothing(world, client):
    job = own(world, name="secret-run")
    client.force_login(world.outsider)

    response = client.get(f"/jobs/new/?from={job.pk}")

    assert "secret-run" not in response.content.decode()


# --- jobs list ------------------------------------------------------------------------------


def test_jobs_list_filters_by_queue_project_tenant_user_and_time(world, client):
    client.force_login(world.tenant_admin)
    other_queue = f.QueueFactory(tenant=world.tenant, name="other-q", pool=world.pool)
    other_project = f.ProjectFactory(tenant=world.tenant, slug="other-p")
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member, name="a-one")
    f.JobFactory(
        queue=other_queue, project=other_project, submitted_by=world.tenant_admin, name="b-two"
    )
    old = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, name="c-old"
    )
    Job.objects.filter(pk=old.pk).update(submitted_at=old.submitted_at.replace(year=2020))

    def names(**query):
        page = client.get("/jobs/", {"mine": "", **query}).context["page"]
        return sorted(j.name for j in page.object_list)

    assert names(queue=other_queue.pk) == ["b-two"]
    assert names(project=other_project.pk) == ["b-two"]
    assert names(user="nlp-member") == ["a-one", "c-old"]
    assert names(tenant="nlp") == ["a-one", "b-two", "c-old"]
    assert names(since="1d") == ["a-one", "b-two"]
    assert names(tenant="vision") == []  # not a choice of theirs: the filter is refused
    assert "tenant" in client.get("/jobs/", {"tenant": "vision"}).context["form"].errors


def test_jobs_list_sorts_by_a_column_both_ways(world, member_client):
    for name in ("bravo", "alpha", "charlie"):
        own(world, name=name)

    up = member_client.get("/jobs/", {"mine": "on", "sort": "name"}).context["page"]
    down = member_client.get("/jobs/", {"mine": "on", "sort": "-name"}).context["page"]
    body = member_client.get("/jobs/", {"mine": "on", "sort": "name"}).content.decode()

    assert [j.name for j in up.object_list] == ["alpha", "bravo", "charlie"]
    assert [j.name for j in down.object_list] == ["charlie", "bravo", "alpha"]
    assert "sort=-name" in body  # the head sorts the other way next
    assert "Name ▲" in body


def test_long_names_are_clipped_with_the_full_name_in_a_title(world, member_client):
    long_name = "a-very-long-experiment-name-" * 4
    own(world, name=long_name)

    body = member_client.get("/jobs/").content.decode()

    assert f'class="clip" title="{long_name}"' in body


def test_bulk_cancel_cancels_the_ticked_jobs_the_user_may_manage(
    world, member_client, dispatch_requests
):
    mine = [own(world, name=f"mine-{n}") for n in range(2)]
    theirs = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.tenant_admin)
    elsewhere = f.JobFactory(queue=world.other_queue, project=world.other_project)

    response = member_client.post(
        "/jobs/bulk",
        {"step": "cancel", "job": [j.pk for j in (*mine, theirs, elsewhere)], "next": "/jobs/"},
        follow=True,
    )

    states = {j.pk: Job.objects.get(pk=j.pk).state for j in (*mine, theirs, elsewhere)}
    assert states == {
        mine[0].pk: JobState.CANCELLED,
        mine[1].pk: JobState.CANCELLED,
        theirs.pk: JobState.PENDING,  # refused: not theirs
        elsewhere.pk: JobState.PENDING,  # another tenant's: not even seen
    }
    body = response.content.decode()
    assert "Cancel done for 2 job(s)." in body
    assert f"{theirs.pk}: Only the job" in body
    assert JobEvent.objects.filter(kind="cancelled").count() == 2


def test_bulk_hold_and_nothing_ticked(world, member_client, dispatch_requests):
    job = own(world)

    member_client.post("/jobs/bulk", {"step": "hold", "job": [job.pk]})
    empty = member_client.post("/jobs/bulk", {"step": "cancel"}, follow=True)

    assert Job.objects.get(pk=job.pk).state == JobState.HELD
    assert "Tick at least one job" in empty.content.decode()


def test_cancel_buttons_ask_for_confirmation(world, member_client):
    job = own(world, name="ask-me")

    page = member_client.get(f"/jobs/{job.pk}/").content.decode()
    listing = member_client.get("/jobs/").content.decode()

    assert f'data-confirm="Cancel job {job.pk} (ask-me, pending)?' in page
    assert 'id="bulk-form" class="bulk" data-confirm="{step} {n} selected job(s)?' in listing


# --- nodes ------------------------------------------------------------------------------------


def test_platform_admin_removes_a_down_node_that_never_ran_a_job(world, client):
    node = f.NodeFactory(name="gone-01", pool=world.pool, state=NodeState.DOWN)
    f.GpuFactory(node=node, index=0, uuid="GPU-gone-0")
    client.force_login(world.platform_admin)

    page = client.get("/nodes/").content.decode()
    response = client.post(f"/nodes/{node.pk}/remove", follow=True)

    assert 'id="remove-gone-01"' in page
    assert not Node.objects.filter(pk=node.pk).exists()
    assert "Node gone-01 removed." in response.content.decode()
    assert AuditEvent.objects.filter(action="node.delete").exists()


def test_a_down_node_with_history_is_retired_and_hidden(world, client):
    node = world.nodes[0]
    job = f.placed_job(gpus=list(node.gpus.all()[:1]), queue=world.queue, project=world.project)
    job.allocations.update(released_at=job.admitted_at)
    Node.objects.filter(pk=node.pk).update(state=NodeState.DOWN)
    client.force_login(world.platform_admin)

    client.post(f"/nodes/{node.pk}/remove")

    node.refresh_from_db()
    assert NODE_RETIRED_LABEL in node.labels
    assert AuditEvent.objects.filter(action="node.retire").exists()
    assert f'id="node-{node.name}"' not in client.get("/nodes/").content.decode()
    assert f'id="node-{node.name}"' in client.get("/nodes/?retired=1").content.decode()


def test_a_node_that_is_not_down_is_not_removed(world, client):
    node = world.nodes[1]
    client.force_login(world.platform_admin)

    response = client.post(f"/nodes/{node.pk}/remove", follow=True)

    assert Node.objects.filter(pk=node.pk).exists()
    assert "only a down node can be removed" in response.content.decode()


def test_tenant_admin_cannot_remove_nodes(world, client):
    node = world.nodes[1]
    Node.objects.filter(pk=node.pk).update(state=NodeState.DOWN)
    client.force_login(world.tenant_admin)

    response = client.post(f"/nodes/{node.pk}/remove")

    assert response.status_code == 403
    assert Node.objects.filter(pk=node.pk).exists()
    assert "Only platform admins" in response.content.decode()


# --- errors -----------------------------------------------------------------------------------


def test_a_refused_page_is_styled_says_why_and_logs_no_traceback(world, member_client, caplog):
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = member_client.get("/audit/")

    body = response.content.decode()
    assert response.status_code == 403
    assert 'id="error-403"' in body and 'class="topbar"' in body
    assert "audit log" in body
    assert "nlp-admin" in body  # whom to ask
    records = [r for r in caplog.records if r.name == "django.request"]
    assert records and all(r.exc_info is None for r in records)


def test_not_found_is_a_page_in_the_layout(world, member_client):
    response = member_client.get("/jobs/999999/")

    assert response.status_code == 404
    body = response.content.decode()
    assert 'id="error-404"' in body and 'class="topbar"' in body
    assert "tenant you are not a member of" in body


def test_server_error_page_renders_without_a_request_context():
    from portal.views import server_error

    response = server_error(None)

    assert response.status_code == 500
    assert "Something broke on our side" in response.content.decode()


def test_favicon_is_served(db, client):
    response = client.get("/favicon.ico")

    assert response.status_code == 301
    assert response["Location"].endswith("favicon.svg")


# --- approvals and the demo -------------------------------------------------------------------


def test_approvals_explain_raises_above_the_tenant_admins_ceiling(world, client, dispatch_requests):
    from scheduling.services.raises import priority_raise_request

    TenantRaiseCeiling.objects.create(tenant=world.tenant, ceiling=world.normal)
    job = own(world)
    raise_ = priority_raise_request(user=world.member, job=job, to_class=world.high, reason="r")
    client.force_login(world.tenant_admin)

    body = client.get("/approvals/").content.decode()

    assert 'id="above-ceiling"' in body
    assert f'id="above-{raise_.pk}"' in body
    assert "nlp's admins may approve up to <strong>normal</strong>" in body


def test_demo_lets_the_tenant_admin_approve_the_members_raise(db, dispatch_requests):
    from django.contrib.auth import get_user_model

    from scheduling.selectors import raises_decidable_by

    call_command("seed_demo", stdout=io.StringIO())
    call_command("seed_demo", stdout=io.StringIO())  # again: nothing doubled

    admin = get_user_model().objects.get(username="nlp-admin")
    decidable = list(raises_decidable_by(admin))
    assert [r.requested_by.username for r in decidable] == ["nlp-member"]
    assert PriorityRaise.objects.filter(state=RaiseState.PENDING).count() == 2
    ended = set(Job.objects.filter(name__startswith="demo-").values_list("state", flat=True))
    assert {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.PREEMPTED,
        JobState.RECLAIMED,
        JobState.TIMED_OUT,
        JobState.CANCELLED,
    } <= ended
