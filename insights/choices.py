from django.db import models


class Resolution(models.TextChoices):
    """How long one rollup row's bucket is: minutes are kept for days, hours for months."""

    MINUTE = "minute", "Minute"
    HOUR = "hour", "Hour"


class RecommendationKind(models.TextChoices):
    LOWER_GUARANTEE = "lower_guarantee", "Guarantee unused"
    QUEUE_WAIT = "queue_wait", "Queue waits too long"
    REPEATED_FAILURE = "repeated_failure", "Jobs fail repeatedly"
    IDLE_GPUS = "idle_gpus", "GPUs idle for days"
    SHORT_IDLE_WINDOW = "short_idle_window", "Sessions reclaimed often"
    FREQUENT_RAISES = "frequent_raises", "Frequent raises or exemptions"


class RecommendationState(models.TextChoices):
    OPEN = "open", "Open"
    APPLIED = "applied", "Applied"
    DISMISSED = "dismissed", "Dismissed"
