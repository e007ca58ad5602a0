"""``manage.py seed_service_demo``: the demo's service, after ``seed_demo``, once."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command


def test_the_demo_service_is_seeded_once(db, dispatch_requests):
    from inference.models import Service

    call_command("seed_demo", stdout=StringIO())
    out = StringIO()
    call_command("seed_service_demo", stdout=out)
    service = Service.objects.get(name="chat")
    assert "created" in out.getvalue()
    assert service.tenant.slug == "nlp" and service.queue.name == "serve"
    assert service.command[1].endswith("scheduling/agent/sample_model_server.py")
    out = StringIO()
    call_command("seed_service_demo", stdout=out)
    assert "exists" in out.getvalue() and Service.objects.count() == 1


def test_the_demo_service_needs_the_demo(db):
    with pytest.raises(CommandError):
        call_command("seed_service_demo", stdout=StringIO())
