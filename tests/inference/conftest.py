"""Fixtures of the inference services' tests: the ``world`` of tests/conftest.py plus an
inference pool and queue (``serving``), and a service of the member there (``service``)."""

import pytest

from tests.inference.factories import ServiceFactory
from tests.inference.factories import serving as make_serving


@pytest.fixture
def serving(world):
    return make_serving(world)


@pytest.fixture
def service(world, serving):
    """nlp's service "chat" in project llm: 1-4 replicas of 1 GPU, target 4 per replica."""
    return ServiceFactory(
        queue=serving.queue,
        project=world.project,
        created_by=world.member,
        name="chat",
        min_replicas=1,
        max_replicas=4,
        target_running_per_replica=4,
    )
