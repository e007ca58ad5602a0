"""Settings for the test suite: the production settings with test-friendly defaults.

DATABASE_URL and CELERY_BROKER_URL still come from the environment, so CI runs the same
suite against PostgreSQL and Redis.
"""

import os
import tempfile

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("SLUICE_VAR_DIR", tempfile.mkdtemp(prefix="sluice-test-"))

from portal.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", True)  # noqa: F405
SLUICE_NODE_TRANSPORT = env_str("SLUICE_NODE_TRANSPORT", "memory")  # noqa: F405
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
STORAGES["staticfiles"]["BACKEND"] = "django.contrib.staticfiles.storage.StaticFilesStorage"  # noqa: F405
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
# Eager dispatch tasks run cycle after cycle in one test: unpaced (tests of the pacing set it).
SLUICE_DISPATCH_MIN_GAP_MS = env_int("SLUICE_DISPATCH_MIN_GAP_MS", 0)  # noqa: F405
