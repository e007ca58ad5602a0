"""Fixtures of the scheduling tests.

Priority raises: ``world`` has classes low (200), normal (400) and high (600, can preempt);
these add ``urgent`` (800), above nlp's raise ceiling ``high``, and a pending job of the
member. Reports sent through a broker: ``broker`` and ``send``.
"""

import pytest

from scheduling.agent.transport import CeleryReportSender
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


@pytest.fixture
def broker(settings, tmp_path):
    """The embedded broker in a folder of the test's own, for the workers and the senders."""
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.SLUICE_BROKER_DIR = str(tmp_path / "broker")
    return settings.SLUICE_BROKER_DIR


@pytest.fixture
def send(broker):
    """``send(reports, **options)``: one agent's batch, as its sender (made with
    ``options``) publishes it."""
    senders = []

    def publish(reports, **options):
        sender = CeleryReportSender("filesystem://", broker, **options)
        senders.append(sender)
        sender.send_batch(reports)

    yield publish
    for sender in senders:
        sender.close()
