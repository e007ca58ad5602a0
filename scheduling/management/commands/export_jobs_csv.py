"""`manage.py export_jobs_csv [--days N] [--out FILE]`: Sluice's finished jobs as a trace.

Writes the jobs that ran and ended in the simulator's plain CSV format (docs/simulator.md),
so that ``manage.py simulate --trace FILE`` replays the cluster's own history.
"""

from django.core.management.base import BaseCommand

from scheduling.services.whatif import history_jobs, history_trace_jobs
from scheduling.simulator.readers import write_csv


class Command(BaseCommand):
    help = "Export finished jobs in the simulator's CSV format."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, help="only jobs submitted in the last N days")
        parser.add_argument("--out", help="file to write (default: standard output)")

    def handle(self, *args, **options):
        rows = history_trace_jobs(history_jobs(days=options["days"]).iterator(chunk_size=2000))
        if options["out"]:
            with open(options["out"], "w", newline="") as handle:
                count = write_csv(rows, handle)
            self.stderr.write(f"Wrote {count:,} jobs to {options['out']}")
        else:
            write_csv(rows, self.stdout)
