"""Observability that steers policy: rollups of waits, depth, allocation and
utilization; Prometheus metrics; insights pages; usage accounting; recommendations and
the weekly policy review."""
