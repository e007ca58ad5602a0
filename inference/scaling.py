"""A service's scaling settings, declared once: name, type, default, bounds, label, help.

``ScalingSettings`` is the declaration: one field a setting, its type and default, and its
bounds, label and help in the field's metadata. The autoscaler's ``Policy`` and the
services' ``ServiceSpec`` are subclasses of it (they hold the settings themselves); the
model fields (``inference.models.Service``), the API's input serializers and the service
form are built from ``SCALING_SETTINGS``, read from it. Change a default or a bound here
and every one of them follows (a test checks that they agree).

Standard library only at import time: the autoscaler (no Django) reads the declaration.
The builders import Django, DRF and the forms module when called.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields


def _setting(
    default: int | float | bool | None,
    min_value: int | float | None = None,
    max_value: int | float | None = None,
    *,
    label: str,
    help_text: str,
) -> typing.Any:
    """A field of ``ScalingSettings``: its default, and the rest of its declaration."""
    declared = {"min_value": min_value, "max_value": max_value, "label": label}
    return field(default=default, metadata={**declared, "help_text": help_text})


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingSettings:
    """A service's scaling settings with their defaults. An optional setting (``| None``)
    is empty by default: no ceiling."""

    min_replicas: int = _setting(
        1,
        0,
        1000,
        label="Min replicas",
        help_text="Replicas kept at least (0 only with scale to zero).",
    )
    max_replicas: int = _setting(
        4,
        1,
        1000,
        label="Max replicas",
        help_text="Replicas at most (the tenant's quota may hold it lower).",
    )
    target_running_per_replica: float = _setting(
        4.0,
        0.01,
        100000,
        label="Target ongoing requests per replica",
        help_text="Ongoing requests (running + waiting) one replica should carry.",
    )
    latency_slo_ms: int | None = _setting(
        None,
        1,
        3_600_000,
        label="p95 latency SLO (ms)",
        help_text="p95 request latency to keep under (empty: none).",
    )
    error_rate_max: float | None = _setting(
        None,
        0.0,
        1.0,
        label="Error rate ceiling (0-1)",
        help_text="Share of failing requests (0-1, e.g. 0.01 for 1 %) above which a replica "
        "is added (empty: none).",
    )
    gpu_util_max: float | None = _setting(
        None,
        1.0,
        100.0,
        label="GPU utilization ceiling (%)",
        help_text="Mean GPU utilization (%) of the replicas above which a replica is added "
        "(empty: none).",
    )
    stable_window_s: int = _setting(
        60,
        6,
        3600,
        label="Stable window (s)",
        help_text="The load is averaged over this window for the usual decisions.",
    )
    panic_window_s: int = _setting(
        6,
        1,
        3600,
        label="Panic window (s)",
        help_text="A short window that reacts to bursts (shorter than the stable window).",
    )
    panic_threshold: float = _setting(
        2.0,
        1.1,
        100.0,
        label="Panic threshold (× replicas)",
        help_text="When the panic window's load needs this many times the current replicas, "
        "scale up at once and do not scale down for a stable window.",
    )
    scale_up_max_step: int = _setting(
        4,
        0,
        1000,
        label="Scale-up step (replicas)",
        help_text="Replicas added at most per decision (0: no limit).",
    )
    scale_down_delay_s: int = _setting(
        60,
        0,
        86400,
        label="Scale-down delay (s)",
        help_text="A scale-down waits until fewer replicas were wanted this long (no flapping).",
    )
    scale_to_zero: bool = _setting(
        False,
        label="Scale to zero",
        help_text="Stop the last replica after the grace period without a request; needs "
        "min replicas 0.",
    )
    scale_to_zero_grace_s: int = _setting(
        300,
        0,
        7 * 86400,
        label="Scale-to-zero grace (s)",
        help_text="Without a request this long, a service that may scale to zero stops its "
        "last replica.",
    )


@dataclass(frozen=True, slots=True)
class ScalingSetting:
    """One setting as the builders read it. ``optional``: its type admits None (empty
    means "none"), and None is its default."""

    name: str
    kind: type  # int, float or bool
    default: int | float | bool | None
    min_value: int | float | None = None
    max_value: int | float | None = None
    optional: bool = False
    label: str = ""
    help_text: str = ""


_KINDS = {"int": int, "float": float, "bool": bool}


def _read(declared) -> ScalingSetting:
    """A setting from its field of ``ScalingSettings`` (its type written ``int``,
    ``float``, ``bool``, or one of them ``| None``)."""
    kind, _, none = str(declared.type).partition(" | ")
    return ScalingSetting(
        declared.name,
        _KINDS[kind],
        declared.default,
        optional=none == "None",
        **declared.metadata,
    )


SCALING_SETTINGS: tuple[ScalingSetting, ...] = tuple(_read(f) for f in fields(ScalingSettings))
SETTINGS_BY_NAME: dict[str, ScalingSetting] = {s.name: s for s in SCALING_SETTINGS}
#: The default of every setting (None: empty, no ceiling).
DEFAULTS: dict[str, int | float | bool | None] = {s.name: s.default for s in SCALING_SETTINGS}
NAMES: tuple[str, ...] = tuple(s.name for s in SCALING_SETTINGS)


def _validators(setting: ScalingSetting) -> list:
    from django.core.validators import MaxValueValidator, MinValueValidator

    out = []
    # A positive integer field holds 0 already: no validator for a lower bound of 0.
    if setting.min_value is not None and not (setting.kind is int and setting.min_value == 0):
        out.append(MinValueValidator(setting.min_value))
    if setting.max_value is not None:
        out.append(MaxValueValidator(setting.max_value))
    return out


def model_field(name: str):
    """The ``Service`` model field of a setting."""
    from django.db import models

    setting = SETTINGS_BY_NAME[name]
    kwargs: dict = {"help_text": setting.help_text}
    if setting.optional:
        kwargs.update(null=True, blank=True)
    else:
        kwargs["default"] = setting.default
    if setting.kind is bool:
        return models.BooleanField(**kwargs)
    kwargs["validators"] = _validators(setting)
    if setting.kind is int:
        return models.PositiveIntegerField(**kwargs)
    return models.FloatField(**kwargs)


def serializer_field(name: str):
    """The API input field of a setting: never required (absent keeps the default or the
    stored value); an optional setting takes null for "none"."""
    from rest_framework import serializers

    setting = SETTINGS_BY_NAME[name]
    kwargs: dict = {"required": False, "help_text": setting.help_text}
    if setting.kind is bool:
        return serializers.BooleanField(**kwargs)
    kwargs.update(min_value=setting.min_value, max_value=setting.max_value)
    if setting.optional:
        kwargs["allow_null"] = True
    if setting.kind is int:
        return serializers.IntegerField(**kwargs)
    return serializers.FloatField(**kwargs)


def form_field(name: str):
    """The service form's field of a setting, its default as the initial value."""
    from django import forms

    setting = SETTINGS_BY_NAME[name]
    kwargs: dict = {"label": setting.label, "help_text": setting.help_text}
    if setting.kind is bool:
        return forms.BooleanField(required=False, initial=setting.default, **kwargs)
    kwargs.update(
        required=not setting.optional,
        min_value=setting.min_value,
        max_value=setting.max_value,
        initial=setting.default,
    )
    if setting.kind is int:
        return forms.IntegerField(**kwargs)
    return forms.FloatField(**kwargs)


def with_settings(base: type, field_of, *, name: str, doc: str) -> type:
    """``base`` (the API's input serializer, the service form) with one field per setting,
    ``field_of(setting name)``, after its own: made through its metaclass as a class
    statement would make it."""
    fields = {setting.name: field_of(setting.name) for setting in SCALING_SETTINGS}
    namespace = {"__module__": base.__module__, "__qualname__": name, "__doc__": doc}
    return type(base)(name, (base,), {**namespace, **fields})
