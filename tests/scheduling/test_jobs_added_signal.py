"""What a submission tells the dispatcher once it commits: the waiting jobs changed
(``WAITING_VERSION_KEY``) and a cycle is wanted (``DISPATCH_REQUESTED_KEY``, merged while
one is queued): ``enqueue.jobs_added_on_commit``, in one Redis round trip on Redis."""

import os

import pytest
from django.core.cache import cache, caches

from scheduling.choices import WorkloadType
from scheduling.services import enqueue
from scheduling.services.enqueue import DISPATCH_REQUESTED_KEY, WAITING_VERSION_KEY
from scheduling.services.jobs import JobSpec, job_submit
from scheduling.services.jobs import job_submit_bulk as submit_bulk


def _spec(world) -> JobSpec:
    return JobSpec(
        queue=world.queue,
        project=world.project,
        name="",
        workload_type=WorkloadType.TRAINING,
        command=["python", "train.py"],
    )


@pytest.fixture
def sent(monkeypatch):
    """The dispatch tasks sent (instead of sending them)."""
    calls: list[int] = []
    monkeypatch.setattr(enqueue, "_send_dispatch", lambda: calls.append(1))
    return calls  # the flag it leaves set is cleared by tests/conftest.py


def _submit(world, django_capture_on_commit_callbacks, bulk: int = 0) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        if bulk:
            submit_bulk(user=world.member, specs=[_spec(world) for _ in range(bulk)])
        else:
            job_submit(user=world.member, spec=_spec(world))
    assert len(callbacks) == 1  # one hook for both signals


def test_a_submission_bumps_the_version_and_requests_one_cycle(
    world, sent, django_capture_on_commit_callbacks
):
    cache.delete(DISPATCH_REQUESTED_KEY)
    cache.set(WAITING_VERSION_KEY, 41, timeout=None)

    _submit(world, django_capture_on_commit_callbacks)
    _submit(world, django_capture_on_commit_callbacks, bulk=3)

    assert cache.get(WAITING_VERSION_KEY) == 43
    assert cache.get(DISPATCH_REQUESTED_KEY) == 1
    assert sent == [1]  # the second request merged into the queued cycle
    cache.delete(DISPATCH_REQUESTED_KEY)  # the cycle starts
    _submit(world, django_capture_on_commit_callbacks)
    assert sent == [1, 1]


def test_without_a_version_yet_any_value_is_a_change(
    world, sent, django_capture_on_commit_callbacks
):
    cache.delete(WAITING_VERSION_KEY)
    _submit(world, django_capture_on_commit_callbacks)
    assert cache.get(WAITING_VERSION_KEY) == 1


@pytest.fixture
def redis_cache(settings):
    """The default cache on Redis (the PostgreSQL stage of .ci/run sets REDIS_URL)."""
    url = os.environ.get("REDIS_URL", "")
    if not url.startswith("redis://"):
        pytest.skip("needs REDIS_URL (see .ci/run)")
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": "test-jobs-added",
        }
    }
    cache.delete_many([WAITING_VERSION_KEY, DISPATCH_REQUESTED_KEY])
    yield cache
    cache.delete_many([WAITING_VERSION_KEY, DISPATCH_REQUESTED_KEY])


def test_on_redis_both_signals_are_one_round_trip(
    world, sent, redis_cache, monkeypatch, django_capture_on_commit_callbacks
):
    import redis

    commands: list[str] = []
    pipelines: list[list[str]] = []
    real_execute = redis.Redis.execute_command
    real_pipeline = redis.client.Pipeline.execute

    def execute(self, *args, **options):
        commands.append(str(args[0]))
        return real_execute(self, *args, **options)

    def pipeline_execute(self, *args, **options):
        pipelines.append([str(command[0][0]) for command in self.command_stack])
        return real_pipeline(self, *args, **options)

    redis_cache.set(WAITING_VERSION_KEY, 7, timeout=None)
    monkeypatch.setattr(redis.Redis, "execute_command", execute)
    monkeypatch.setattr(redis.client.Pipeline, "execute", pipeline_execute)

    _submit(world, django_capture_on_commit_callbacks)
    _submit(world, django_capture_on_commit_callbacks)

    assert pipelines == [["INCRBY", "SET"], ["INCRBY", "SET"]]
    assert commands == []  # nothing outside the pipelines
    monkeypatch.setattr(redis.Redis, "execute_command", real_execute)
    monkeypatch.setattr(redis.client.Pipeline, "execute", real_pipeline)
    # Django's cache reads what the pipeline wrote, under the same key names: the
    # leader's version check, and the dispatch task's delete of the flag.
    assert redis_cache.get(WAITING_VERSION_KEY) == 9
    assert redis_cache.get(DISPATCH_REQUESTED_KEY) == 1
    backend = caches["default"]
    ttl = backend._cache.get_client().ttl(backend.make_key(DISPATCH_REQUESTED_KEY))
    assert 0 < ttl <= enqueue.DISPATCH_REQUESTED_SECONDS
    assert sent == [1]
    redis_cache.delete(DISPATCH_REQUESTED_KEY)
    _submit(world, django_capture_on_commit_callbacks)
    assert sent == [1, 1]


def test_on_redis_the_client_is_made_once(
    world, sent, redis_cache, monkeypatch, django_capture_on_commit_callbacks
):
    """Each client redis-py makes builds its table of reply handlers: the submissions of
    one process use one client (over the cache's own connection pool)."""
    from django.core.cache.backends.redis import RedisCacheClient

    made: list[bool] = []
    real_get_client = RedisCacheClient.get_client

    def get_client(self, key=None, *, write=False):
        made.append(write)
        return real_get_client(self, key, write=write)

    monkeypatch.setattr(RedisCacheClient, "get_client", get_client)
    for _ in range(3):
        _submit(world, django_capture_on_commit_callbacks)
    assert made == [True]
    assert redis_cache.get(WAITING_VERSION_KEY) == 3
