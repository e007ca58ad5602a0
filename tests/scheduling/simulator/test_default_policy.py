"""The simulator's ``sluice`` policy is always the portal's default: one definition
(scheduling.engine.defaults) that the engine's Snapshot, the portal's settings, the
dispatch loop, the workload policies and the simulator all read."""

import dataclasses

from django.conf import settings

from scheduling.engine import Snapshot, defaults
from scheduling.models import WorkloadPolicy
from scheduling.services.dispatch import order_settings
from scheduling.simulator.policies import KNOBS, POLICIES


def test_the_defaults_cover_every_order_knob_of_the_engine():
    assert set(defaults.ORDER_DEFAULTS) == {"size_order", *KNOBS}
    names = {field.name for field in dataclasses.fields(Snapshot)}
    assert set(defaults.ORDER_DEFAULTS) <= names


def test_the_sluice_policy_is_the_portals_default():
    sluice = POLICIES["sluice"]
    assert sluice.order_knobs() == defaults.ORDER_DEFAULTS
    # The dispatch loop hands the engine exactly these settings when no SLUICE_* variable
    # overrides them (the test settings set none).
    assert order_settings() == {**defaults.ORDER_DEFAULTS, **defaults.SHARING_DEFAULTS}
    assert settings.SLUICE_MAX_WAIT_SECONDS == defaults.MAX_WAIT_SECONDS
    assert settings.SLUICE_FAIR_SHARE_BAND == defaults.FAIR_SHARE_BAND
    assert settings.SLUICE_PREEMPTION_MIN_GAIN_SECONDS == defaults.PREEMPTION_MIN_GAIN_SECONDS
    # A new workload policy's maximum wait is the same default.
    assert WorkloadPolicy().max_wait_seconds == defaults.MAX_WAIT_SECONDS
    assert sluice.backfill and sluice.preemption and sluice.fair_share


def test_the_time_sharing_defaults_are_the_engines_and_the_simulators():
    names = {field.name for field in dataclasses.fields(Snapshot)}
    assert set(defaults.SHARING_DEFAULTS) <= names
    snapshot = Snapshot(now=0.0, nodes=[], quotas=[], queues=[], running=[], pending=[])
    for name, value in defaults.SHARING_DEFAULTS.items():
        assert getattr(snapshot, name) == value
    sharing = POLICIES["sluice-timeshare"]
    assert sharing.time_sharing and sharing.order_knobs() == defaults.ORDER_DEFAULTS
    assert settings.SLUICE_TIME_SHARING_LEVELS_GPU_HOURS == (64.0, 1024.0)


def test_the_best_measured_settings_are_the_default_and_the_earlier_ones_stay_to_compare():
    # sluice-tuned measured best (docs/benchmarks.md): the default is its order without its
    # 4 h minimum preemption gain, which would make a higher class wait (DESIGN §6).
    tuned = POLICIES["sluice-tuned"].order_knobs()
    assert tuned == {**POLICIES["sluice"].order_knobs(), "preemption_min_gain_seconds": 14400.0}
    assert POLICIES["sluice"].order_knobs()["preemption_min_gain_seconds"] == 0.0
    earlier = POLICIES["sluice-2026-12"].order_knobs()
    assert earlier == defaults.EARLIER_DEFAULTS
    assert earlier["max_wait_seconds"] == 12 * 3600
    assert earlier["fair_share_band"] == 0.25
    assert earlier["preemption_min_gain_seconds"] == 0
