"""Rebuild the hour rollups and daily usage of the last days from the recorded jobs and
allocations (see insights.services.rollups.rollups_backfill): history for a fresh install."""

from django.core.management.base import BaseCommand, CommandError

from insights.services.rollups import rollups_backfill


class Command(BaseCommand):
    help = (
        "Rebuild the hour rollups (queue depth and waits, GPUs allocated per pool, model and "
        "tenant) and the allocated GPU-hours per day from the recorded jobs and allocations. "
        "Used GPU-hours come from the jobs' recorded GPU series; jobs without one count 0 used."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=7, help="How many days back (default 7).")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="Rebuild hours that already have rows too (their utilization is lost).",
        )

    def handle(self, *args, days: int, replace: bool, **options):
        if not 1 <= days <= 3660:
            raise CommandError("--days must be between 1 and 3660.")
        result = rollups_backfill(days=days, replace=replace)
        self.stdout.write(
            f"{result['hours']} hours from {result['jobs']} jobs: {result['queue_rows']} queue "
            f"rows, {result['usage_rows']} usage rows, {result['usage_days']} daily usage rows."
        )
