"""`manage.py simulate --trace itp-2021|alibaba-pai-2023|FILE.csv [--policy ...]`.

Replays a GPU cluster trace through the scheduling engine under several policies and
compares them. A thin wrapper: the simulator (scheduling.simulator) needs no Django.

On the pure-Python engine (no `make native` build, or a stale one) a long replay is first
announced with a rough estimate of its time and how to make it faster.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from scheduling.engine import native
from scheduling.simulator.cli import add_arguments, run
from scheduling.simulator.readers import TraceError

# The whole itp-2021 trace (69,351 jobs) replayed on the pure-Python engine in the `make run`
# environment: FIFO 17 s, the three default policies 679 s, so about 331 s for each of the
# others (sluice, sluice-no-backfill and the sluice-* variants cost alike).
FULL_TRACE_JOBS = 69_351
PURE_SECONDS_FULL_TRACE = {"fifo": 17.0}
PURE_SECONDS_FULL_TRACE_OTHERS = 331.0
# A deeper queue costs more per job: time grows faster than the job count, taken as
# jobs ** 1.5 from the whole trace down. On the side of caution: the first 4,000 and 12,000
# jobs of cluster04 took 3.6 s and 14.3 s on a faster machine, a third of what it gives.
GROWTH = 1.5
# The compiled engine against the pure one, same machine, one worker: the first 12,000 jobs
# of itp-2021's cluster04 under fifo, sluice and sluice-no-backfill replayed in 7.2 s
# against 14.3 s (the first 4,000: 2.1 s against 3.6 s).
NATIVE_SPEEDUP = 2
# Shorter replays start without a word.
LONG_REPLAY_SECONDS = 30.0


def pure_engine_estimate(jobs: int, policy_names: list[str]) -> float:
    """Rough seconds a replay of ``jobs`` jobs under these policies takes on the pure-Python
    engine (the machine's speed moves it by up to 2.5x either way)."""
    scale = (max(jobs, 0) / FULL_TRACE_JOBS) ** GROWTH
    return sum(
        PURE_SECONDS_FULL_TRACE.get(name, PURE_SECONDS_FULL_TRACE_OTHERS) * scale
        for name in policy_names
    )


def _duration(seconds: float) -> str:
    if seconds >= 90:
        return f"{round(seconds / 60):,} min"
    return f"{max(10, round(seconds / 10) * 10)} s"


def pure_engine_notice(jobs: int, policy_names: list[str]) -> str | None:
    """The line printed before a long replay on the pure-Python engine; None otherwise."""
    if native.is_compiled():
        return None
    estimate = pure_engine_estimate(jobs, policy_names)
    if estimate < LONG_REPLAY_SECONDS:
        return None
    return (
        f"The scheduling engine runs as pure Python: this replay ({jobs:,} jobs, "
        f"{len(policy_names)} {'policy' if len(policy_names) == 1 else 'policies'}) takes "
        f"roughly {_duration(estimate)}; `make native` compiles the engine (needs a C "
        f"compiler) and replays about {NATIVE_SPEEDUP}x faster."
    )


class Command(BaseCommand):
    help = "Replay a GPU cluster trace under several scheduling policies and compare them."

    def add_arguments(self, parser):
        add_arguments(parser, out_dir=settings.VAR_DIR / "sim")

    def handle(self, *args, **options):
        def before_replay(jobs: int, policies: list) -> None:
            notice = pure_engine_notice(jobs, [policy.name for policy in policies])
            if notice:
                self.stdout.write(self.style.WARNING(notice))

        try:
            run(options, write=self.stdout.write, before_replay=before_replay)
        except (TraceError, ValueError) as error:
            raise CommandError(str(error)) from error
