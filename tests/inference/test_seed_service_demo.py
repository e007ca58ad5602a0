"""``manage.py seed_service_demo``: the demo's service, after ``seed_demo``, once."""

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

import scheduling.agent.sample_model_server as sample_server

SAMPLE_SERVER = Path(sample_server.__file__)


def test_the_demo_service_is_seeded_once(db, dispatch_requests):
    from inference.models import Service

    call_command("seed_demo", stdout=StringIO())
    out = StringIO()
    call_command("seed_service_demo", stdout=out)
    service = Service.objects.get(name="chat")
    assert "created" in out.getvalue()
    assert service.tenant.slug == "nlp" and service.queue.name == "serve"
    # The sample model server: the checkout's, or its copy where the job accounts cannot
    # read the checkout (a clone in root's 0700 home), the same program either way.
    server = Path(service.command[1])
    assert server.name == "sample_model_server.py"
    assert server.read_bytes() == SAMPLE_SERVER.read_bytes()
    out = StringIO()
    call_command("seed_service_demo", stdout=out)
    assert "exists" in out.getvalue() and Service.objects.count() == 1


def test_the_demo_service_needs_the_demo(db):
    with pytest.raises(CommandError):
        call_command("seed_service_demo", stdout=StringIO())
