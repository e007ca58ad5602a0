"""``make run``'s seeding: the ``manage.py`` commands of the Makefile's ``run`` target, in
their order, run twice as two ``make run`` would: the second run fails on nothing and adds
nothing (the demo's inference service included)."""

import re
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def run_target_commands() -> list[str]:
    makefile = (Path(settings.BASE_DIR) / "Makefile").read_text()
    target = re.search(r"^run:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target, "no run target in the Makefile"
    return re.findall(r"manage\.py (\w+)", target.group(1))


def test_make_run_seeds_the_demo_and_its_service():
    commands = run_target_commands()
    assert commands[:3] == ["migrate", "seed_demo", "seed_service_demo"]


def test_make_run_twice_neither_fails_nor_duplicates(dispatch_requests):
    from inference.models import Service, ServiceReplica
    from scheduling.models import Job
    from tenants.models import Tenant

    seeding = [c for c in run_target_commands() if c != "migrate"]  # the test db is migrated
    for command in seeding:
        call_command(command, stdout=StringIO())
    counts = (Tenant.objects.count(), Job.objects.count(), Service.objects.count())
    out = StringIO()
    for command in seeding:
        call_command(command, stdout=out)
    assert (Tenant.objects.count(), Job.objects.count(), Service.objects.count()) == counts
    service = Service.objects.get()
    assert (service.tenant.slug, service.queue.name, service.name) == ("nlp", "serve", "chat")
    assert "exists" in out.getvalue()
    assert ServiceReplica.objects.count() == 0  # replicas come from the beat's service tick
