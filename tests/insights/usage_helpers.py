"""Hand-made UsageDay rows for the usage accounting tests (the rollup writer is not needed)."""

from __future__ import annotations

import datetime as dt

from insights.models import UsageDay


def usage_day(
    *,
    tenant,
    day: dt.date | str,
    pool,
    allocated: float,
    used: float,
    project=None,
    user=None,
    workload_type: str = "training",
    gpu_model: str = "H100-80GB",
) -> UsageDay:
    if isinstance(day, str):
        day = dt.date.fromisoformat(day)
    return UsageDay.objects.create(
        day=day,
        tenant=tenant,
        project=project,
        user=user,
        workload_type=workload_type,
        pool=pool,
        gpu_model=gpu_model,
        allocated_gpu_hours=allocated,
        used_gpu_hours=used,
    )
