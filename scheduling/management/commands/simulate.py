"""`manage.py simulate --trace itp-2021|alibaba-pai-2023|FILE.csv [--policy ...]`.

Replays a GPU cluster trace through the scheduling engine under several policies and
compares them. A thin wrapper: the simulator (scheduling.simulator) needs no Django.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from scheduling.simulator.cli import add_arguments, run
from scheduling.simulator.readers import TraceError


class Command(BaseCommand):
    help = "Replay a GPU cluster trace under several scheduling policies and compare them."

    def add_arguments(self, parser):
        add_arguments(parser, out_dir=settings.VAR_DIR / "sim")

    def handle(self, *args, **options):
        try:
            run(options, write=self.stdout.write)
        except (TraceError, ValueError) as error:
            raise CommandError(str(error)) from error
