"""The embedded default's beat is Celery's own, with nothing of RedBeat's attached: importing
``redbeat.schedulers`` connects its lock handler to every beat, which then failed at each
start of ``make run``'s worker with a traceback (PersistentScheduler has no lock_key)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import django, sys
django.setup()
import portal.celery
from django.conf import settings
print(getattr(settings, "CELERY_BEAT_SCHEDULER", "celery.beat:PersistentScheduler"))
print("redbeat.schedulers" in sys.modules)
"""


def _probe(broker: str) -> list[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", "CELERY_BROKER_URL": broker}
    run = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.split()[-2:]


def test_the_embedded_beat_loads_nothing_of_redbeat():
    assert _probe("filesystem://") == ["celery.beat:PersistentScheduler", "False"]


def test_on_redis_beat_is_the_locked_scheduler():
    scheduler, _loaded = _probe("redis://127.0.0.1:6379/15")
    assert scheduler == "portal.beat:BeatScheduler"
