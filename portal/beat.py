"""Beat on Redis, once however many run: RedBeat's scheduler, made to stand by again when
it loses its lock. Named by ``CELERY_BEAT_SCHEDULER`` only where the broker is Redis
(portal/settings.py); imported by Celery then and only then, because importing
``redbeat.schedulers`` connects its lock handler to every beat, Celery's own included."""

from __future__ import annotations

import logging
import time
import types

from redbeat.schedulers import RedBeatScheduler, acquire_distributed_beat_lock
from redis.exceptions import LockError, RedisError

logger = logging.getLogger("celery.beat")


class BeatScheduler(RedBeatScheduler):
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
