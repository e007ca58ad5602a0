"""A service's own fields are declared once (inference/spec.py): the model fields, the API's
input and output serializers, the service form, the services' ServiceSpec and the list of
fields that make a new spec version agree with that declaration, and where a field is the
replica job's too, its bounds are the job's (scheduling/jobspec.py)."""

from __future__ import annotations

import dataclasses

import pytest
from django import forms
from django.core.validators import MaxValueValidator
from django.db.models import NOT_PROVIDED

from inference import services
from inference.api.serializers import (
    ServiceChangeSerializer,
    ServiceInputSerializer,
    ServiceSerializer,
)
from inference.forms import ServiceForm
from inference.models import Service
from inference.scaling import NAMES as SCALING_NAMES
from inference.spec import DEFAULTS, FIELDS_BY_NAME, NAMES, SERVICE_FIELDS, SPEC_FIELDS
from scheduling.jobspec import FIELDS_BY_NAME as JOB_FIELDS

FIELDS = pytest.mark.parametrize("declared", SERVICE_FIELDS, ids=lambda f: f.name)
INPUTS = pytest.mark.parametrize("serializer", [ServiceInputSerializer, ServiceChangeSerializer])
# Fields a change may not touch (they name the service).
FIXED = {"name"}


def _default(value):
    return value() if callable(value) else value


def _model_max(field) -> int | None:
    highs = [v.limit_value for v in field.validators if isinstance(v, MaxValueValidator)]
    return min(highs) if highs else None


@FIELDS
def test_a_field_the_job_carries_has_the_jobs_bounds(declared):
    if not declared.job_field:
        pytest.skip("not a job field")
    job = JOB_FIELDS[declared.job_field]
    assert declared.max_length == job.max_length
    assert (declared.min_value, declared.max_value) == (job.min_value, job.max_value)
    assert declared.choices == job.choices


@FIELDS
def test_model_field(declared):
    field = Service._meta.get_field(declared.name)
    assert field.help_text == declared.help_text
    if declared.max_length is not None and field.get_internal_type() in ("CharField", "TextField"):
        # JSON columns (command, env, GPU models) and the class (a foreign key) are bounded
        # by the serializers and the form.
        assert field.max_length == declared.max_length
    if declared.required:
        assert field.default is NOT_PROVIDED and not field.blank
    elif declared.default in ("", None):
        assert field.default is NOT_PROVIDED and field.blank  # empty: a blank column
    else:
        assert _default(field.default) == declared.default
    if declared.max_value is not None:
        assert _model_max(field) == declared.max_value
    if declared.choices:
        assert list(field.choices) == list(declared.choices)


@FIELDS
@INPUTS
def test_input_serializer_field(declared, serializer):
    fields = serializer().fields
    if serializer is ServiceChangeSerializer and declared.name in FIXED:
        assert declared.name not in fields
        return
    field = fields[declared.name]
    assert field.required is (declared.required and serializer is ServiceInputSerializer)
    assert (field.help_text or "") == declared.help_text
    if declared.name == "command":
        return  # its size in bytes is checked by the service, as a job's
    if declared.name == "env":
        assert field.child.max_length == declared.max_length
    elif declared.name == "gpu_models":
        assert field.child.max_length == declared.max_length
        assert field.max_length == declared.max_items
    elif declared.max_length is not None:
        assert field.max_length == declared.max_length
    if declared.max_value is not None:
        assert (field.min_value, field.max_value) == (declared.min_value, declared.max_value)
    if declared.choices:
        assert list(field.choices) == [value for value, _ in declared.choices]


@FIELDS
def test_form_field(declared):
    field = ServiceForm.base_fields[declared.name]
    assert (field.help_text or "") == declared.form_help
    if declared.label:
        assert field.label == declared.label
    if isinstance(field, forms.CharField) and declared.name not in ("gpu_models", "env"):
        # The models typed as one comma line, env as NAME=value lines: shapes of their own.
        assert field.max_length == declared.max_length
    if declared.name == "env":
        assert field.max_value_length == declared.max_length
    if declared.max_value is not None:
        assert (field.min_value, field.max_value) == (declared.min_value, declared.max_value)
    if declared.choices:
        assert list(field.choices) == [("", declared.empty_label), *declared.choices]
    if declared.empty_label and declared.name == "priority_class":
        assert field.empty_label == declared.empty_label


def test_the_form_starts_from_every_declared_default_it_shows():
    """A field with a default other than empty, none or nothing selected shows it."""
    shown = {name for name, value in DEFAULTS.items() if value not in ("", None, {}, [])}
    assert shown == {"gpus_per_node", "health_path", "metrics_path"}
    for name in shown:
        assert ServiceForm.base_fields[name].initial == DEFAULTS[name]


def test_service_spec_defaults():
    spec_fields = {f.name: f for f in dataclasses.fields(services.ServiceSpec)}
    for declared in SERVICE_FIELDS:
        field = spec_fields[declared.name]
        if declared.required:
            assert field.default is dataclasses.MISSING
            assert field.default_factory is dataclasses.MISSING
        elif field.default_factory is not dataclasses.MISSING:
            assert field.default_factory() == declared.default
        else:
            assert field.default == declared.default


def test_every_field_is_declared_once_and_everywhere():
    """No field of a service's own is added to one place and not the declaration."""
    spec = {f.name for f in dataclasses.fields(services.ServiceSpec)} - {"project"}
    assert spec == set(NAMES) | set(SCALING_NAMES)
    inputs = set(ServiceInputSerializer().fields) - {"project"}
    assert inputs == set(NAMES) | set(SCALING_NAMES)
    form = set(ServiceForm.base_fields) - {"project"}
    assert form == set(NAMES) | set(SCALING_NAMES)
    assert set(NAMES) | set(SCALING_NAMES) <= set(ServiceSerializer.Meta.fields)


def test_the_spec_version_fields_are_the_declared_ones():
    assert services.SPEC_FIELDS == SPEC_FIELDS
    assert set(SPEC_FIELDS) == {f.name for f in SERVICE_FIELDS if f.in_spec}
    assert set(services.EDITABLE_FIELDS) == (set(NAMES) - FIXED) | set(SCALING_NAMES)


def test_the_declared_defaults_are_what_a_service_gets():
    """A spec built with only what must be given carries every declared default."""
    spec = services.ServiceSpec(project=None, queue=None, name="chat", command=["serve"])
    for name, default in DEFAULTS.items():
        assert getattr(spec, name) == default, name
    assert {FIELDS_BY_NAME[name].default for name in ("health_path", "metrics_path")} == {
        "/health",
        "/metrics",
    }
