"""A service's scaling settings are declared once (inference/scaling.py): the model fields,
the API's input serializers, the service form, the service spec, the autoscaler's Policy
and the services guide's table all agree with that declaration."""

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
from inference.scaling import DEFAULTS, NAMES, SCALING_SETTINGS, SETTINGS_BY_NAME
from inference.services import SCALING_FIELDS, ServiceSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "user" / "services.md"
SETTINGS = pytest.mark.parametrize("setting", SCALING_SETTINGS, ids=lambda s: s.name)


def _bounds(validators) -> tuple:
    low = [v.limit_value for v in validators if isinstance(v, MinValueValidator)]
    high = [v.limit_value for v in validators if isinstance(v, MaxValueValidator)]
    return (max(low) if low else None, min(high) if high else None)


def test_the_policy_has_exactly_the_declared_settings():
    assert tuple(f.name for f in dataclasses.fields(autoscaler.Policy)) == NAMES


@SETTINGS
def test_policy_default(setting):
    assert getattr(autoscaler.Policy(), setting.name) == setting.default == DEFAULTS[setting.name]


@SETTINGS
def test_service_spec_default(setting):
    spec_defaults = {f.name: f.default for f in dataclasses.fields(ServiceSpec)}
    assert spec_defaults[setting.name] == setting.default
    assert setting.name in SCALING_FIELDS


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
