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
