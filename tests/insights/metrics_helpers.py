"""Builders and readers for the metrics tests (tests/insights/test_metrics*.py)."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from scheduling.choices import JobState
from tests import factories as f


@contextmanager
def multiprocess_metrics(tmp_path, monkeypatch, settings):
    """prometheus-client in multiprocess mode on ``tmp_path``/prometheus (a fresh value class:
    the one made at import remembers its files), the instrument's metrics made anew on it;
    all undone when the block ends. Yields the folder."""
    from django.core.cache import cache
    from prometheus_client import values

    from insights import instrument, metrics

    path = tmp_path / "prometheus"
    path.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(path))
    settings.PROMETHEUS_MULTIPROC_DIR = path
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    instrument.metrics_reset()
    cache.delete(metrics.TOTALS_CACHE_KEY)
    yield path
    values.close_all_multiprocess_files()
    monkeypatch.undo()
    instrument.metrics_reset()
    cache.delete(metrics.TOTALS_CACHE_KEY)


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """Samples of an exposition: {(sample name, labels): value}; the parser also checks
    the format."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, frozenset({k: str(v) for k, v in labels.items()}.items())))


def of(samples: dict, name: str) -> dict[frozenset, float]:
    """The samples of one name, by labels."""
    return {labels: v for (n, labels), v in samples.items() if n == name}


def scrape(client, **extra):
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1", **extra)
    assert response.status_code == 200, response.content[:500]
    return parse(response.content.decode())


def job(world, *, queue=None, state=JobState.PENDING, **fields):
    queue = queue or world.queue
    project = world.project if queue.tenant_id == world.tenant.pk else world.other_project
    return f.JobFactory(
        queue=queue,
        project=project,
        submitted_by=world.member,
        state=state,
        **fields,
    )


def placed(world, gpus, *, queue=None, state=JobState.RUNNING, **fields):
    queue = queue or world.queue
    project = world.project if queue.tenant_id == world.tenant.pk else world.other_project
    return f.placed_job(
        gpus=gpus,
        state=state,
        queue=queue,
        project=project,
        submitted_by=world.member,
        **fields,
    )


def sample(gpu, utilization, memory_used_mb=1000, *, age_seconds=1.0):
    gpu.utilization = utilization
    gpu.memory_used_mb = memory_used_mb
    gpu.sampled_at = timezone.now() - timedelta(seconds=age_seconds)
    gpu.save(update_fields=["utilization", "memory_used_mb", "sampled_at"])
