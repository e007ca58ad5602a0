"""Fixtures of the priority-raise tests.

``world`` has classes low (200), normal (400) and high (600, can preempt); these add
``urgent`` (800), above nlp's raise ceiling ``high``, and a pending job of the member.
"""

import pytest

from scheduling.models import TenantRaiseCeiling
from tests import factories as f


@pytest.fixture
def urgent(world):
    """A class above nlp's ceiling: only platform admins approve it; grants last 4 h at most."""
    return f.PriorityClassFactory(
        name="urgent", value=800, can_preempt=True, requires_approval=True, max_grant_hours=4
    )


@pytest.fixture
def ceiling(world, urgent):
    """nlp's admins may approve raises up to ``high`` (set directly: no audit row)."""
    return TenantRaiseCeiling.objects.create(tenant=world.tenant, ceiling=world.high)


@pytest.fixture
def member_job(world):
    """A pending job of the member, at the queue's default class ``normal``."""
    return f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
