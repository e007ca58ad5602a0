"""`manage.py agent --node NAME --pool POOL [--simulate 8xH100-80GB]`: run a node agent.

A thin wrapper: the agent itself (scheduling.agent) imports no Django model and needs only the
broker, so on a GPU node `python -m scheduling.agent ...` does the same without Django settings.
"""

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the node agent for this GPU node (see `python -m scheduling.agent --help`)."

    def run_from_argv(self, argv):
        from django.conf import settings

        from scheduling.agent.cli import main

        args = argv[2:]
        if not any(a == "--broker" or a.startswith("--broker=") for a in args):
            args = ["--broker", settings.CELERY_BROKER_URL, *args]
        if not any(a == "--broker-dir" or a.startswith("--broker-dir=") for a in args):
            args = ["--broker-dir", settings.SLUICE_BROKER_DIR, *args]
        raise SystemExit(main(args))

    def handle(self, *args, **options):  # pragma: no cover - run_from_argv does the work
        raise NotImplementedError
