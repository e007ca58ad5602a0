"""The one place where the portal puts work on a Celery queue.

Services call these functions; no service imports ``scheduling.tasks`` (tasks call
services, so the other direction would be a circle). Tasks are looked up by name in the
Celery app's registry, which also keeps eager execution in the unit tests.

Three kinds of work, three queues (DESIGN §12), so that none starves another:

- ``dispatch``: the single leader's cycle (a worker of its own, concurrency 1);
- ``reports``: what node agents report, processed in batches (scheduling.agent.protocol);
- ``control``: sweeps, notifications, what-if simulations.
"""

from __future__ import annotations

from celery import current_app
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.db import transaction

from scheduling.agent.protocol import REPORTS_QUEUE

DISPATCH_QUEUE = "dispatch"
CONTROL_QUEUE = "control"
__all__ = [
    "CONTROL_QUEUE",
    "DISPATCH_QUEUE",
    "DISPATCH_REQUESTED_KEY",
    "REPORTS_QUEUE",
    "WAITING_VERSION_KEY",
    "dispatch_on_commit",
    "jobs_added_on_commit",
    "reports_probe_enqueue",
    "request_dispatch",
    "simulation_run_enqueue",
    "waiting_changed_on_commit",
]

#: Set while a dispatch cycle is queued and not yet started: requests made meanwhile are
#: merged into it (the task deletes the key when it starts, so a request made during a
#: cycle queues exactly one more).
DISPATCH_REQUESTED_KEY = "sluice:dispatch:requested"


#: A counter bumped (once the change has committed) whenever a waiting job is added, leaves
#: the waiting jobs or changes what the dispatch loop reads of it, by anything but the
#: dispatch leader itself: while it stays the same, the leader's copy of the waiting jobs
#: (scheduling.services.pending_cache) is still right, and a short cycle need not read
#: them again (scheduling.services.dispatch).
WAITING_VERSION_KEY = "sluice:dispatch:waiting-version"


def _task(name: str):
    """The registered task ``name``. Outside a worker nothing has imported the apps' task
    modules yet: the loader's default imports run Celery's autodiscovery once."""
    if name not in current_app.tasks:
        current_app.loader.import_default_modules()
    return current_app.tasks[name]


# How long a dispatch request stays merged into the queued cycle at most (a cycle that
# never started, e.g. its message lost, must not block the requests after it for long).
DISPATCH_REQUESTED_SECONDS = 30


def request_dispatch() -> None:
    """Ask for a dispatch cycle now; requests made while one is queued are merged into it."""
    if cache.add(DISPATCH_REQUESTED_KEY, 1, timeout=DISPATCH_REQUESTED_SECONDS):
        _send_dispatch()


def _send_dispatch() -> None:
    _task("scheduling.dispatch").apply_async(queue=DISPATCH_QUEUE)


def dispatch_on_commit() -> None:
    """Request a dispatch cycle once the current transaction commits (never for a rollback).

    Robust: the change has committed by then, so a broker or cache that fails to take the
    request is logged, not turned into an error for the caller; the periodic cycle
    (``SLUICE_DISPATCH_INTERVAL``) picks the change up."""
    transaction.on_commit(lambda: request_dispatch(), robust=True)


def waiting_changed_on_commit() -> None:
    """Bump ``WAITING_VERSION_KEY`` once the current transaction commits (robust, as
    ``dispatch_on_commit``: a change the dispatcher misses is read by its next full cycle,
    at most ``dispatch._explain_interval()`` later)."""
    transaction.on_commit(_bump_waiting_version, robust=True)


def _bump_waiting_version() -> None:
    try:
        cache.incr(WAITING_VERSION_KEY)
    except ValueError:  # not there yet (or evicted): any new value is a change
        if not cache.add(WAITING_VERSION_KEY, 1, timeout=None):
            cache.incr(WAITING_VERSION_KEY)


def jobs_added_on_commit() -> None:
    """New waiting jobs: once the transaction commits, bump ``WAITING_VERSION_KEY`` and
    request a dispatch cycle (``waiting_changed_on_commit`` and ``dispatch_on_commit``
    together, robust as they are). On a Redis cache both go in one round trip instead of
    three (Django's ``incr`` checks that the key exists first): every job submission
    makes them, and a single client's submissions wait for them."""
    transaction.on_commit(_jobs_added, robust=True)


def _jobs_added() -> None:
    backend = caches["default"]
    if not isinstance(backend, RedisCache):
        _bump_waiting_version()
        request_dispatch()
        return
    # The cache's own connections and key names, so that the dispatcher's cache.delete()
    # and the leader's cache.get() see these keys (an int is stored as is, not pickled).
    pipeline = _redis_client(backend).pipeline(transaction=False)
    pipeline.incr(backend.make_and_validate_key(WAITING_VERSION_KEY))
    pipeline.set(
        backend.make_and_validate_key(DISPATCH_REQUESTED_KEY),
        1,
        nx=True,
        ex=DISPATCH_REQUESTED_SECONDS,
    )
    _, requested = pipeline.execute()
    if requested:
        _send_dispatch()


def _redis_client(backend: RedisCache):
    """The cache's Redis client for writes, made once per cache object: Django's
    ``get_client`` makes a new one at each call, and redis-py fills a table of ~170 reply
    handlers for each client made (half the CPU of the round trip it is made for). A client
    only holds its connection pool, which it shares."""
    client = backend.__dict__.get("_sluice_write_client")
    if client is None:
        client = backend.__dict__["_sluice_write_client"] = backend._cache.get_client(write=True)
    return client


def reports_probe_enqueue(sent_at: float) -> None:
    """Send a probe through the reports queue: when a worker handles it, every report
    queued before it has been handled (see ``nodes.nodes_sweep_lost``)."""
    _task("scheduling.reports_probe").apply_async(args=[sent_at], queue=REPORTS_QUEUE)


def simulation_run_enqueue(run_id: int) -> None:
    """Queue a what-if replay (long: it goes to the control queue, never the dispatch one)."""
    _task("scheduling.simulation_run").apply_async(args=[run_id], queue=CONTROL_QUEUE)
