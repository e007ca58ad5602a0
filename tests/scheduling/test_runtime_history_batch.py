"""Runtime history from a batch of reports: added once the batch is through, in one short
transaction, only for ends that committed (scheduling.services.runtime_history)."""

import pytest

from scheduling.choices import JobState
from scheduling.models import RuntimeHistory
from scheduling.services.runtime_history import runtime_history_batch, runtime_history_record
from scheduling.tasks import agent_reports

from .test_agent_reports import _placed_job
from .test_report_batches import _exited, _started


@pytest.fixture(autouse=True)
def _logs(settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path / "logs"


def _entries(world, submitter):
    row = RuntimeHistory.objects.filter(
        project=world.project, workload_type="training", submitted_by=submitter
    ).first()
    return row.entries if row else []


def test_a_batch_of_ends_adds_every_job_to_both_rows(world, django_capture_on_commit_callbacks):
    first, node_a = _placed_job(world)
    second, node_b = _placed_job(world)
    with django_capture_on_commit_callbacks(execute=True):
        agent_reports(
            [_started(node_a, first), _started(node_b, second)]
            + [_exited(node_a, first), _exited(node_b, second)]
        )
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == second.state == JobState.SUCCEEDED
    assert len(_entries(world, world.member)) == 2
    assert len(_entries(world, None)) == 2


def test_an_end_rolled_back_adds_nothing(world, django_capture_on_commit_callbacks):
    job, node = _placed_job(world)
    job.state = JobState.SUCCEEDED  # as if it had ended, then its transaction failed
    job.finished_at = job.admitted_at
    with django_capture_on_commit_callbacks(execute=True), runtime_history_batch():
        try:
            with __import__("django.db").db.transaction.atomic():
                runtime_history_record(job)
                raise RuntimeError("the report failed")
        except RuntimeError:
            pass
    assert _entries(world, world.member) == [] and _entries(world, None) == []
