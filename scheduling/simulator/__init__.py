"""Trace-driven simulator: replay GPU cluster traces through the real scheduling engine.

Pure Python, no Django (like :mod:`scheduling.engine`): a trace is read
(:mod:`.readers`), made into a scenario (:mod:`.scenario`: cluster, tenants, quotas,
classes, limits), replayed under each policy by a discrete-event loop whose every
decision comes from :func:`scheduling.engine.plan` (:mod:`.replay`), and summed up
(:mod:`.metrics`, :mod:`.report`).
"""

from __future__ import annotations

from .model import ClassSpec, NodeSpec, Scenario, SimJob, Trace, TraceJob, WorkloadSpec
from .parallel import compare, replay_split
from .policies import DEFAULT_POLICIES, POLICIES, Policy, parse_policies
from .scenario import ScenarioOptions, build_scenario
from .simulation import JobRun, Replay, ReplayResult, ReplayStalled, SimConfig, replay
from .snapshot import SnapshotBuilder

__all__ = [
    "DEFAULT_POLICIES",
    "POLICIES",
    "ClassSpec",
    "JobRun",
    "NodeSpec",
    "Policy",
    "Replay",
    "ReplayResult",
    "ReplayStalled",
    "Scenario",
    "ScenarioOptions",
    "SimConfig",
    "SimJob",
    "SnapshotBuilder",
    "Trace",
    "TraceJob",
    "WorkloadSpec",
    "build_scenario",
    "compare",
    "parse_policies",
    "replay",
    "replay_split",
]
