"""The Celery application shared by the control workers and beat.

Node agents do not use this app: they talk to the broker directly (see scheduling.agent).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("sluice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
