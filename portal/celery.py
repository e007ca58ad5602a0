"""The Celery application shared by the control workers and beat.

Node agents do not use this app: they talk to the broker directly (see scheduling.agent).
"""

import os

from celery import Celery
from celery.signals import task_prerun, worker_init, worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("sluice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _close_old_connections(task=None, **_kwargs) -> None:
    """What Django does around each request, around each task: drop a connection that broke
    or outlived ``CONN_MAX_AGE``, keep the others (see CELERY_DB_REUSE_MAX in the settings).
    Not for eager tasks: they run inside the caller's transaction."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


@worker_init.connect
def _metrics_dir_prepare(**_kwargs) -> None:
    """A worker starts: prometheus-client's multiprocess directory exists, without the files
    of processes that no longer run (insights.instrument)."""
    from django.conf import settings

    from insights.instrument import multiprocess_dir_prepare

    multiprocess_dir_prepare(settings.PROMETHEUS_MULTIPROC_DIR)


@worker_process_shutdown.connect
def _metrics_process_dead(pid=None, **_kwargs) -> None:
    """A pool child exits: prometheus-client's bookkeeping for a dead process."""
    from insights.instrument import process_dead

    process_dead(int(pid or os.getpid()))


def _beat_scheduler_class():
    """RedBeat's scheduler, made to stand by again when it loses its lock (see
    ``CELERY_BEAT_SCHEDULER`` in the settings), or None where RedBeat is not installed."""
    try:
        from redbeat.schedulers import RedBeatScheduler, acquire_distributed_beat_lock
    except ImportError:
        return None
    import logging
    import time
    import types

    from redis.exceptions import LockError, RedisError

    logger = logging.getLogger("celery.beat")

    class SluiceBeatScheduler(RedBeatScheduler):
        """A beat that cannot renew its lock in time (it stalled longer than the lock, or
        Redis went away) has lost it, maybe to another beat: RedBeat's own raises and the
        beat process ends, leaving no standby. This one drops the lock, waits until it holds
        it again (as a standby does), then goes on. Tasks are idempotent, so a due task sent
        by both beats around the moment of a takeover costs a second cycle, nothing more."""

        def tick(self, *args, **kwargs):
            try:
                return super().tick(*args, **kwargs)
            except (LockError, RedisError) as exc:
                logger.warning("beat: lost the lock (%s); standing by until it holds it again", exc)
                self.lock = None
                while True:
                    try:
                        acquire_distributed_beat_lock(sender=types.SimpleNamespace(scheduler=self))
                        return 0.0
                    except RedisError as again:
                        logger.warning("beat: cannot reach Redis for the lock (%s)", again)
                        time.sleep(self.max_interval)

    return SluiceBeatScheduler


#: ``CELERY_BEAT_SCHEDULER`` on Redis: "portal.celery:BeatScheduler".
BeatScheduler = _beat_scheduler_class()
