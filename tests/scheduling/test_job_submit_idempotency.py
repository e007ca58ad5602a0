"""``Idempotency-Key`` on ``POST /api/v1/jobs`` and ``POST /api/v1/jobs/bulk``: a retry
with the same key answers the first answer again and creates nothing."""

import threading
import time
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.utils import timezone
from freezegun import freeze_time

from scheduling.models import IdempotencyKey, Job
from scheduling.services import idempotency
from scheduling.services.idempotency import idempotency_keys_expire
from scheduling.services.jobs import job_submit

CREATE, BULK = "/api/v1/jobs", "/api/v1/jobs/bulk"


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()  # the "expired keys deleted" mark


def spec(world, **overrides):
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        **overrides,
    }


def post(client, url, body, key):
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post(url, body, format="json", headers=headers)


def test_a_retry_answers_the_first_answer_and_creates_nothing(
    world, api, dispatch_requests, django_capture_on_commit_callbacks
):
    client = api(world.member)
    with django_capture_on_commit_callbacks(execute=True):
        first = post(client, CREATE, spec(world, name="train-1"), "retry-1")
    assert first.status_code == 201, first.json()
    assert "Idempotent-Replayed" not in first
    with django_capture_on_commit_callbacks(execute=True):
        again = post(client, CREATE, spec(world, name="train-1"), "retry-1")
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert Job.objects.count() == 1 and Job.objects.get().pk == first.json()["id"]
    assert dispatch_requests == [1]  # the replay asked for no dispatch either


def test_the_same_body_in_another_key_order_is_the_same_request(world, api, dispatch_requests):
    client = api(world.member)
    body = spec(world, name="train-1", env={"A": "1", "B": "2"})
    first = post(client, CREATE, body, "k")
    reordered = dict(reversed(list(body.items())), env={"B": "2", "A": "1"})
    again = post(client, CREATE, reordered, "k")
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]


def test_bulk_and_arrays_are_replayed_with_the_same_ids(world, api, dispatch_requests):
    client = api(world.member)
    body = {"jobs": [spec(world, name=f"sweep-{i}") for i in range(3)]}
    first = post(client, BULK, body, "sweep")
    again = post(client, BULK, body, "sweep")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and len(first.json()["ids"]) == 3
    assert again["Idempotent-Replayed"] == "true"
    array = post(client, CREATE, spec(world, array=4), "array")
    array_again = post(client, CREATE, spec(world, array=4), "array")
    assert array_again.json() == array.json() and array.json()["count"] == 4
    assert Job.objects.count() == 7


def test_the_same_key_with_another_body_is_refused(world, api, dispatch_requests):
    client = api(world.member)
    post(client, CREATE, spec(world, name="a"), "k")
    response = post(client, CREATE, spec(world, name="b"), "k")
    assert response.status_code == 422
    data = response.json()
    assert data["code"] == "idempotency_key_reused" and "Idempotency-Key" in data["errors"]
    assert "another request" in data["detail"]
    # Nor on the other endpoint.
    assert post(client, BULK, {"jobs": [spec(world, name="a")]}, "k").status_code == 422
    assert Job.objects.count() == 1


def test_keys_are_per_user(world, api, dispatch_requests):
    mine = post(api(world.member), CREATE, spec(world), "shared")
    theirs = post(api(world.tenant_admin), CREATE, spec(world), "shared")
    assert mine.status_code == theirs.status_code == 201
    assert "Idempotent-Replayed" not in theirs
    assert mine.json()["id"] != theirs.json()["id"] and Job.objects.count() == 2


def test_a_refused_submission_keeps_no_key(world, api, dispatch_requests):
    client = api(world.member)
    bad = post(client, CREATE, spec(world, gpus_per_node=99), "k")
    assert bad.status_code == 400 and not IdempotencyKey.objects.exists()
    good = post(client, CREATE, spec(world), "k")  # the key is free: a new request
    assert good.status_code == 201 and "Idempotent-Replayed" not in good


@pytest.mark.parametrize(
    "key", ["", "x" * 256, "tab\there", "naïve", " padded", "line\nbreak"], ids=repr
)
def test_a_key_that_cannot_be_one_is_a_400(world, api, key, dispatch_requests):
    response = api(world.member).post(CREATE, spec(world), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400, response.json()
    assert "Idempotency-Key" in response.json()["errors"]
    assert not Job.objects.exists()


def test_the_longest_key_is_fine(world, api, dispatch_requests):
    key = "k" * 255
    assert post(api(world.member), CREATE, spec(world), key).status_code == 201
    assert IdempotencyKey.objects.get().key == key


def test_keys_expire_after_a_day(world, api, dispatch_requests):
    client = api(world.member)
    start = timezone.now()
    with freeze_time(start) as clock:
        first = post(client, CREATE, spec(world), "daily")
        clock.tick(timedelta(hours=23))
        assert post(client, CREATE, spec(world), "daily")["Idempotent-Replayed"] == "true"
        clock.tick(timedelta(hours=1, seconds=1))
        later = post(client, CREATE, spec(world), "daily")
        assert later.status_code == 201 and "Idempotent-Replayed" not in later
        assert later.json()["id"] != first.json()["id"]
        assert IdempotencyKey.objects.count() == 1  # the expired row was replaced
        post(client, CREATE, spec(world), "other")
        clock.tick(timedelta(days=2))
        assert idempotency_keys_expire() == 2
    assert not IdempotencyKey.objects.exists()


def test_expired_keys_of_everyone_are_deleted_by_a_later_submission(world, api, dispatch_requests):
    with freeze_time(timezone.now()) as clock:
        post(api(world.tenant_admin), CREATE, spec(world), "old")
        clock.tick(timedelta(days=2))
        cache.clear()
        post(api(world.member), CREATE, spec(world), "new")
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]


def test_a_concurrent_request_that_committed_first_is_replayed(
    world, api, dispatch_requests, monkeypatch
):
    """Two requests with one key: the second's claim of the key hits the unique constraint
    (on PostgreSQL it waits for the first to commit), so it answers the first's answer."""
    client = api(world.member)
    first = post(client, CREATE, spec(world), "race")
    real = idempotency._stored
    calls = []

    def not_yet_committed(user, key, now):
        calls.append(key)
        return None if len(calls) == 1 else real(user, key, now)

    monkeypatch.setattr(idempotency, "_stored", not_yet_committed)
    second = post(client, CREATE, spec(world), "race")
    assert second.status_code == 201 and second["Idempotent-Replayed"] == "true"
    assert second.json() == first.json() and Job.objects.count() == 1
    assert len(calls) == 2


def test_viewers_and_outsiders_are_refused_as_without_a_key(world, api, dispatch_requests):
    viewer = post(api(world.viewer), CREATE, spec(world), "k")
    outsider = post(api(world.outsider), CREATE, spec(world), "k")
    assert viewer.status_code == 403 and outsider.status_code == 404
    assert post(api(world.viewer), CREATE, spec(world), "k").status_code == 403
    assert not Job.objects.exists() and not IdempotencyKey.objects.exists()


def test_without_a_key_every_request_submits(world, api, dispatch_requests):
    client = api(world.member)
    assert post(client, CREATE, spec(world), None).status_code == 201
    assert post(client, CREATE, spec(world), None).status_code == 201
    assert Job.objects.count() == 2 and not IdempotencyKey.objects.exists()


def test_the_schema_documents_the_header(world, api):
    schema = api(world.member).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    for path in ("/api/v1/jobs/", "/api/v1/jobs/bulk/"):
        operation = schema["paths"][path]["post"]
        names = [p["name"] for p in operation["parameters"] if p["in"] == "header"]
        assert "Idempotency-Key" in names
        assert "422" in operation["responses"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_create_once_on_postgresql(world):
    """Real concurrency: the second request's claim of the key waits on the first's
    transaction, then finds the key taken and replays the first answer."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers; this needs PostgreSQL (the CI suite runs it)")
    barrier = threading.Barrier(2)
    answers: list = []
    errors: list = []

    def submit_slowly():
        job = job_submit(user=world.member, spec=_spec(world))
        time.sleep(0.5)  # the other request arrives meanwhile
        return idempotency.Answer(201, {"id": job.pk})

    def request():
        try:
            barrier.wait()
            answers.append(
                idempotency.job_submit_idempotent(
                    user=world.member, key="race", endpoint="jobs.create", data={"a": 1},
                    submit=submit_slowly,
                )
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    assert Job.objects.count() == 1
    assert sorted(a.replayed for a in answers) == [False, True]
    assert answers[0].body == answers[1].body == {"id": Job.objects.get().pk}


def _spec(world):
    from scheduling.services.jobs import JobSpec

    return JobSpec(
        project=world.project,
        queue=world.queue,
        name="race",
        workload_type="training",
        command=["python", "train.py"],
    )
