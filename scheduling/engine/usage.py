"""Fair-share usage history: GPU-seconds per tenant with exponential decay."""

from __future__ import annotations

import math


def decay_usage(
    usage: dict[str, float],
    elapsed_seconds: float,
    half_life_seconds: float,
    gpus_in_use: dict[str, int],
) -> dict[str, float]:
    """Return the usage after ``elapsed_seconds`` more of history.

    Old usage is multiplied by ``d = 0.5 ** (elapsed / half_life)``. The GPUs in use are
    assumed constant over the interval and are integrated exactly under the same decay,
    so that splitting an interval in two gives the same result as one step::

        new = old * d + gpus * integral_0^elapsed 0.5 ** ((elapsed - s) / half_life) ds
            = old * d + gpus * half_life / ln 2 * (1 - d)

    (for a short interval this is ``gpus * elapsed``). A half-life ``<= 0`` disables the
    decay (``new = old + gpus * elapsed``). Tenants whose usage falls below 1e-9 are
    dropped. The input dicts are not modified.
    """
    if elapsed_seconds <= 0:
        result = dict(usage)
        return {tenant: value for tenant, value in result.items() if value > 1e-9}
    if half_life_seconds > 0:
        factor = 0.5 ** (elapsed_seconds / half_life_seconds)
        accrual = half_life_seconds / math.log(2) * (1.0 - factor)
    else:
        factor = 1.0
        accrual = float(elapsed_seconds)
    result = {tenant: value * factor for tenant, value in usage.items()}
    for tenant, gpus in gpus_in_use.items():
        if gpus:
            result[tenant] = result.get(tenant, 0.0) + gpus * accrual
    return {tenant: value for tenant, value in result.items() if value > 1e-9}
