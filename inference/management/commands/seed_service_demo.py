"""``manage.py seed_service_demo``: the demo's inference service (after ``seed_demo``).

Tenant nlp's service ``chat`` in queue ``serve`` (pool inference): 1-2 replicas of the
sample model server (scheduling/agent/sample_model_server.py), one A100 each, a target of
2 ongoing requests per replica and a p95 SLO of 500 ms. Idempotent: nothing is done when
the service exists. Send it traffic with ``GET http://<host>:<port>/infer`` on the ports
``GET /api/v1/services/{id}/endpoints`` lists, and watch it scale on its page.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from inference.choices import ServiceState
from inference.models import Service
from inference.services import ServiceSpec, service_create
from portal.errors import BusinessError
from scheduling.models import Queue
from tenants.models import Project

SERVER = settings.BASE_DIR / "scheduling" / "agent" / "sample_model_server.py"


def _server():
    """The server's path, or a copy the job accounts can read where they cannot read the
    checkout (a 0700 home); the copy is removed by ``make demo-reset``."""
    from scheduling.agent.workdir import reachable_copy

    return reachable_copy(SERVER, created_ledger=settings.VAR_DIR / "created.jsonl")


class Command(BaseCommand):
    help = "Create the demo's inference service (tenant nlp, queue serve) if it is missing."

    def handle(self, *args, **options):
        queue = Queue.objects.filter(tenant__slug="nlp", name="serve").first()
        user = get_user_model().objects.filter(username="nlp-member").first()
        project = Project.objects.filter(tenant__slug="nlp").order_by("slug").first()
        if queue is None or user is None or project is None:
            raise CommandError("Run manage.py seed_demo first (tenant nlp, queue serve).")
        existing = (
            Service.objects.filter(project=project, name="chat")
            .exclude(state=ServiceState.DELETED)
            .first()
        )
        if existing is not None:
            self.stdout.write(f"service {existing.pk} ({existing}) exists")
            return
        spec = ServiceSpec(
            project=project,
            queue=queue,
            name="chat",
            description="Demo: the sample model server, 50 ms per request, 4 at once.",
            command=["python3", str(_server()), "--service-ms", "50", "--concurrency", "4"],
            min_replicas=1,
            max_replicas=2,
            target_running_per_replica=2,
            latency_slo_ms=500,
            scale_down_delay_s=60,
        )
        try:
            service = service_create(user=user, spec=spec)
        except BusinessError as exc:
            raise CommandError(f"The demo service could not be created: {exc.message}") from None
        self.stdout.write(f"service {service.pk} ({service}) created")
