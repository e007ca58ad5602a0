"""Names of states and kinds of inference services."""

from django.db import models


class ServiceState(models.TextChoices):
    ACTIVE = "active", "Active"
    PAUSED = "paused", "Paused (no replicas)"
    DELETED = "deleted", "Deleted"


class BlockedReason(models.TextChoices):
    """Why a service has fewer replicas than it wants: a pending job's reason codes
    (DESIGN §6) and the service's own."""

    AT_QUOTA = "WAITING_FOR_QUOTA", "At the tenant's quota"
    SUBMIT_REFUSED = "SUBMIT_REFUSED", "A replica could not be submitted"
