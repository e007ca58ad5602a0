"""A service's scaling settings are declared once (inference/scaling.py): the model fields,
the API's input serializers, the service form, the service spec, the autoscaler's Policy
and the services guide's table all agree with that declaration; the service spec and the
Policy are the declaration itself (subclasses that redeclare none of its fields)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db.models import NOT_PROVIDED

from inference import autoscaler
from inference.api.serializers import ServiceChangeSerializer, ServiceInputSerializer
from inference.forms import ServiceForm
from inference.models import Service
from inference.scaling import (
    DEFAULTS,
    NAMES,
    SCALING_SETTINGS,
    SETTINGS_BY_NAME,
    ScalingSettings,
    model_field,
)
from inference.services import SCALING_FIELDS, ServiceSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "user" / "services.md"
SETTINGS = pytest.mark.parametrize("setting", SCALING_SETTINGS, ids=lambda s: s.name)


def _bounds(validators) -> tuple:
    low = [v.limit_value for v in validators if isinstance(v, MinValueValidator)]
    high = [v.limit_value for v in validators if isinstance(v, MaxValueValidator)]
    return (max(low) if low else None, min(high) if high else None)


def test_the_policy_has_exactly_the_declared_settings():
    assert tuple(f.name for f in dataclasses.fields(autoscaler.Policy)) == NAMES


@pytest.mark.parametrize("holder", [autoscaler.Policy, ServiceSpec], ids=lambda c: c.__name__)
def test_the_policy_and_the_spec_hold_the_declaration_unchanged(holder):
    """Neither redeclares a setting (a field of its own would take its own type and
    default): each setting is the declaration's field, as it is there."""
    assert issubclass(holder, ScalingSettings)
    for cls in holder.__mro__[: holder.__mro__.index(ScalingSettings)]:
        redeclared = set(cls.__dict__.get("__annotations__", {})) & set(NAMES)
        assert not redeclared, f"{cls.__name__} redeclares {sorted(redeclared)}"
    declared = {f.name: f for f in dataclasses.fields(ScalingSettings)}
    for held in dataclasses.fields(holder):
        if held.name in declared:
            assert (held.type, held.default) == (
                declared[held.name].type,
                declared[held.name].default,
            )


@SETTINGS
def test_an_optional_setting_is_empty_by_default(setting):
    assert setting.optional is (setting.default is None)


@SETTINGS
def test_policy_default(setting):
    assert getattr(autoscaler.Policy(), setting.name) == setting.default == DEFAULTS[setting.name]


@SETTINGS
def test_service_spec_default(setting):
    spec_defaults = {f.name: f.default for f in dataclasses.fields(ServiceSpec)}
    assert spec_defaults[setting.name] == setting.default
    assert setting.name in SCALING_FIELDS


@SETTINGS
def test_the_model_field_is_the_declared_one(setting):
    """Every argument of the column (type, default, null, validators, help) is the
    declaration's: a model field written by hand in its place differs here."""
    _, path, args, kwargs = Service._meta.get_field(setting.name).deconstruct()
    assert (path, args, kwargs) == model_field(setting.name).deconstruct()[1:]


@SETTINGS
def test_model_field(setting):
    field = Service._meta.get_field(setting.name)
    if setting.optional:
        assert field.null and field.blank
        assert field.default is NOT_PROVIDED
    else:
        assert not field.null
        assert field.default == setting.default
    assert field.help_text == setting.help_text
    if setting.kind is bool:
        assert field.get_internal_type() == "BooleanField"
        return
    low, high = _bounds(field.validators)
    if setting.kind is int:
        assert field.get_internal_type() == "PositiveIntegerField"
        low = 0 if low is None else low  # a positive integer field's own floor
    else:
        assert field.get_internal_type() == "FloatField"
    assert (low, high) == (setting.min_value, setting.max_value)


@SETTINGS
@pytest.mark.parametrize("serializer", [ServiceInputSerializer, ServiceChangeSerializer])
def test_serializer_field(setting, serializer):
    field = serializer().fields[setting.name]
    assert field.required is False
    assert field.allow_null is setting.optional
    if setting.kind is not bool:
        assert (field.min_value, field.max_value) == (setting.min_value, setting.max_value)


@SETTINGS
def test_form_field(setting):
    field = ServiceForm.base_fields[setting.name]
    assert field.initial == setting.default
    assert field.label == setting.label
    assert field.help_text == setting.help_text
    if setting.kind is bool:
        assert field.required is False
        return
    assert field.required is not setting.optional
    assert (field.min_value, field.max_value) == (setting.min_value, setting.max_value)


def _doc_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        match = re.match(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|", line)
        if match and match.group(1) in SETTINGS_BY_NAME:
            rows[match.group(1)] = (match.group(2).strip(), match.group(3).strip())
    return rows


def _number(text: str) -> float:
    return float(text)


@SETTINGS
def test_the_guide_table(setting):
    default, bounds = _doc_rows()[setting.name]
    if setting.default is None:
        assert default.startswith("empty")
    elif setting.kind is bool:
        assert default == str(setting.default).lower()
    else:
        assert math.isclose(_number(default), setting.default)
    if setting.kind is bool:
        assert bounds == "—"
    else:
        low, high = bounds.split("–")
        assert math.isclose(_number(low), setting.min_value)
        assert math.isclose(_number(high), setting.max_value)


def test_the_guide_lists_every_setting_once():
    assert sorted(_doc_rows()) == sorted(NAMES)


def test_the_autoscaler_still_imports_no_django():
    """The declaration is standard library at import time: the autoscaler reads it alone."""
    code = "import sys, inference.autoscaler; sys.exit('django' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
