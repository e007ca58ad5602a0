"""Observability that steers policy (issue 20): rollups of waits, depth, allocation and
utilization; Prometheus metrics; insights pages; usage accounting; recommendations and
the weekly policy review."""
