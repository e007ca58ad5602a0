"""A job's submitted fields are declared once (scheduling/jobspec.py): the submit API's
serializer and the submit page's form are built from the declaration, and the services'
JobSpec, the Job model's columns, "submit again" and the CLI's flags and spec files (the
CLI is installed without the server, so it keeps its own table) agree with it."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
from django.core.exceptions import FieldDoesNotExist
from django.db.models import NOT_PROVIDED
from django.test import RequestFactory

from scheduling import jobspec
from scheduling.api.serializers import (
    JobBulkSerializer,
    JobSubmitSerializer,
    submit_serializer_class,
)
from scheduling.forms import JobSubmitForm, submit_form_class
from scheduling.jobspec import FIELDS_BY_NAME, FORM_FIELDS, JOB_FIELDS, NAMES
from scheduling.models import Job, PriorityClass
from scheduling.services.jobs import JobSpec
from scheduling.views import _initial_from_job
from sluice_cli import main as cli
from tests import factories as f

FIELDS = pytest.mark.parametrize("field", JOB_FIELDS, ids=lambda field: field.name)
ON_FORM = pytest.mark.parametrize("field", FORM_FIELDS, ids=lambda field: field.name)
# Integer columns' ranges (Django's database-independent ones).
COLUMN_RANGES = {
    "PositiveSmallIntegerField": (0, 32767),
    "PositiveIntegerField": (0, jobspec.MAX_INT32),
    "BigIntegerField": (-jobspec.MAX_INT64 - 1, jobspec.MAX_INT64),
}


def _default(value):
    return value() if callable(value) else value


# --- the API -----------------------------------------------------------------------------------


def test_the_serializer_has_exactly_the_declared_fields_in_order():
    assert tuple(JobSubmitSerializer().fields) == NAMES
    assert tuple(JobBulkSerializer().fields["jobs"].child.fields) == NAMES


@FIELDS
def test_serializer_field(field):
    built = JobSubmitSerializer().fields[field.name]
    assert built.required is field.required
    assert built.help_text == jobspec.help_for_api(field)
    if not field.required:
        assert _default(built.default) == field.default
    assert built.allow_null is field.nullable
    if field.kind in (jobspec.INT, jobspec.DURATION):
        assert (built.min_value, built.max_value) == (field.min_value, field.max_value)
    if field.kind in (jobspec.TEXT, jobspec.CLASS):
        assert built.max_length == field.max_length
        assert built.allow_blank
    if field.kind == jobspec.CHOICE:
        assert list(built.choices) == [value for value, _ in field.choices]
        assert built.allow_blank is not field.required
    if field.kind == jobspec.STRINGS:
        assert built.child.max_length == field.max_length


def test_a_gpu_model_key_longer_than_declared_is_refused_by_the_api():
    limit = FIELDS_BY_NAME["gpu_model"].max_length
    serializer = JobSubmitSerializer(
        data={"project": 1, "queue": 1, "workload_type": "training", "command": ["true"]}
        | {"gpu_model": ["X" * (limit + 1)]}
    )
    assert not serializer.is_valid()
    assert "gpu_model" in serializer.errors
    ok = JobSubmitSerializer(
        data={"project": 1, "queue": 1, "workload_type": "training", "command": ["true"]}
        | {"gpu_model": "X" * limit}
    )
    assert ok.is_valid(), ok.errors
    assert ok.validated_data["gpu_model"] == ["X" * limit]


# --- the submit page ---------------------------------------------------------------------------


def test_the_form_has_exactly_the_declared_page_fields_in_order():
    assert tuple(JobSubmitForm.base_fields) == tuple(field.name for field in FORM_FIELDS)
    assert {field.name for field in FORM_FIELDS} < set(NAMES)


@ON_FORM
def test_form_field(field):
    built = JobSubmitForm.base_fields[field.name]
    assert built.label == field.label
    assert built.help_text == jobspec.help_for_form(field)
    if field.kind == jobspec.INT:
        assert (built.min_value, built.max_value) == (field.min_value, field.max_value)
        assert built.initial == field.default
        assert built.required is not field.nullable
    if field.kind == jobspec.DURATION:
        assert (built.min_value, built.max_value) == (field.min_value, field.max_value)
        assert built.required is False
    if field.kind in (jobspec.TEXT, jobspec.COMMAND):
        assert built.max_length == field.max_length
    if field.kind == jobspec.CHOICE:
        offered = [value for value, _ in built.choices if value]
        assert offered == [value for value, _ in field.choices]
        assert built.initial == (field.initial if field.required else field.default)
    if field.kind == jobspec.STRINGS:
        assert built.max_value_length == field.max_length
    if field.kind == jobspec.MODELS:
        assert built.max_key_length == field.max_length
    if field.kind == jobspec.CLASS:
        assert built.empty_label == field.empty_label
    if field.kind in (jobspec.CHOICE, jobspec.MODELS) and not field.required:
        assert built.widget.choices[0] == ("", field.empty_label)


def _page_form(world, **data) -> JobSubmitForm:
    values = {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "gpus_per_node": 1,
        "nodes": 1,
        "command": "python train.py",
        **data,
    }
    return JobSubmitForm(
        values,
        projects=world.project.__class__.objects.all(),
        queues=world.queue.__class__.objects.all(),
        priority_classes=PriorityClass.objects.all(),
    )


@pytest.mark.parametrize("name", ["env", "gpu_model"])
def test_the_page_refuses_what_the_api_refuses(world, name):
    """The API refuses an env value over 8,192 characters and a GPU model key over 40; the
    page took both."""
    limit = FIELDS_BY_NAME[name].max_length
    too_long = {"env": f"A={'x' * (limit + 1)}", "gpu_model": "X" * (limit + 1)}[name]
    just_so = {"env": f"A={'x' * limit}", "gpu_model": "X" * limit}[name]

    refused = _page_form(world, **{name: too_long})
    accepted = _page_form(world, **{name: just_so})

    assert not refused.is_valid()
    assert str(limit) in " ".join(refused.errors[name])
    assert accepted.is_valid(), accepted.errors


def test_a_duration_beyond_the_column_is_a_field_error(world):
    form = _page_form(world, max_runtime_seconds=f"{jobspec.MAX_INT32 + 1}s")
    assert not form.is_valid()
    assert "At most" in " ".join(form.errors["max_runtime_seconds"])


def test_submit_again_fills_every_field_of_the_page(world, rf: RequestFactory):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    request = rf.get(f"/jobs/new/?from={job.pk}")
    request.user = world.member

    initial = _initial_from_job(request)

    assert set(initial) == {field.name for field in FORM_FIELDS}
    form = JobSubmitForm(
        initial,
        projects=world.project.__class__.objects.all(),
        queues=world.queue.__class__.objects.all(),
        priority_classes=PriorityClass.objects.all(),
    )
    assert form.is_valid(), form.errors


# --- the services' spec and the model --------------------------------------------------------


@FIELDS
def test_jobspec_takes_the_field_with_the_declared_default(field):
    spec_fields = {f.name: f for f in dataclasses.fields(JobSpec)}
    assert field.attribute in spec_fields
    spec_field = spec_fields[field.attribute]
    if field.kind in (jobspec.ID, jobspec.CLASS):  # the spec holds the object, or None
        assert spec_field.default in (None, dataclasses.MISSING)
        return
    # Where the spec has no default, every caller gives the field.
    if spec_field.default is not dataclasses.MISSING:
        assert spec_field.default == field.default
    if spec_field.default_factory is not dataclasses.MISSING:
        assert spec_field.default_factory() == field.default


@FIELDS
def test_model_column(field):
    try:
        column = Job._meta.get_field(field.attribute)
    except FieldDoesNotExist:  # an array is stored as array_id and array_index
        assert field.name == "array"
        return
    if field.kind == jobspec.CLASS:
        assert PriorityClass._meta.get_field("name").max_length == field.max_length
        return
    if field.kind == jobspec.TEXT:
        assert column.max_length == field.max_length
    if field.kind == jobspec.CHOICE:
        assert column.choices == list(field.choices)
    if field.kind in (jobspec.INT, jobspec.DURATION):
        low, high = COLUMN_RANGES[column.get_internal_type()]
        assert low <= field.min_value and field.max_value <= high
        assert column.null is (field.nullable and field.kind == jobspec.INT)
    if field.kind in (jobspec.INT, jobspec.BOOL) and column.default is not NOT_PROVIDED:
        assert column.default == field.default


#: Columns whose help is their own: the project and queue are foreign keys (the API takes
#: their ids), and ``priority_class`` is the effective class (raises change it), which the
#: job keeps beside the class it was submitted at.
OWN_HELP = {"project", "queue", "priority_class"}


@FIELDS
def test_model_column_help_and_default(field):
    """A column that keeps a declared field takes its help and default from the declaration."""
    if field.name == "array" or field.name in OWN_HELP:
        return
    column = Job._meta.get_field(field.attribute)
    assert column.help_text == jobspec.column_help(field.name) == jobspec.help_for_api(field)
    if field.kind in (jobspec.INT, jobspec.BOOL) and not field.nullable:
        assert column.default == field.default


# --- the CLI -----------------------------------------------------------------------------------


def _submit_parser() -> argparse.ArgumentParser:
    parser = cli._parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["submit"]


def cli_mismatches(fields=JOB_FIELDS) -> list[str]:
    """Where the CLI's spec files and flags disagree with the declaration."""
    by_name = {field.name: field for field in fields}
    found = []
    missing = sorted(set(by_name) - cli.SPEC_FIELDS)
    unknown = sorted(cli.SPEC_FIELDS - set(by_name))
    found += [f"a spec file cannot give {name}" for name in missing]
    found += [f"a spec file takes {name}, which is not declared" for name in unknown]
    found += [
        f"the alias {alias} names {name}, which is not declared"
        for alias, name in cli.SPEC_ALIASES.items()
        if name not in by_name
    ]
    actions = {a.dest: a for a in _submit_parser()._actions}
    for flag in cli.SUBMIT_FLAGS:
        field = by_name.get(flag.field)
        if field is None:
            found.append(f"{flag.names[0]} sets {flag.field}, which is not declared")
            continue
        action = actions.get(flag.field)
        if action is None or set(action.option_strings) != set(flag.names):
            found.append(f"{flag.names[0]}: not in the submit command's parser")
        whole = field.kind == jobspec.INT
        if (flag.type is int) is not whole:
            found.append(f"{flag.names[0]}: a whole number is {whole} for {field.kind}")
        if whole and flag.bounds != (field.min_value, field.max_value):
            found.append(
                f"{flag.names[0]}: bounds {flag.bounds}, declared "
                f"{(field.min_value, field.max_value)}"
            )
        if whole and flag.default != field.default:
            found.append(f"{flag.names[0]}: default {flag.default}, declared {field.default}")
        if whole and flag.bounds and f"{flag.bounds[0]} to {flag.bounds[1]}" not in action.help:
            found.append(f"{flag.names[0]}: the help does not show the bounds")
        if field.kind == jobspec.CHOICE and flag.choices != tuple(v for v, _ in field.choices):
            found.append(f"{flag.names[0]}: choices {flag.choices}, declared {field.choices}")
        if field.initial is not None and f"default: {field.initial}" not in (flag.help or ""):
            found.append(f"{flag.names[0]}: the help does not say the default {field.initial}")
        repeats = field.kind in (jobspec.STRINGS, jobspec.MODELS)
        if (flag.many is not None) is not repeats:
            found.append(f"{flag.names[0]}: repeatable is {repeats} for {field.kind}")
        if flag.switch is not (field.kind == jobspec.BOOL):
            found.append(f"{flag.names[0]}: a switch only for a yes/no field")
    return found


def test_the_cli_agrees_with_the_declaration():
    assert cli_mismatches() == []


def test_a_spec_file_may_give_every_declared_field(tmp_path):
    """The API takes ``serve``; the CLI's spec files refused it as an unknown field."""
    spec = {
        field.name: field.default if not field.required else "1"
        for field in JOB_FIELDS
        if field.name != "serve"
    } | {"serve": {"health_path": "/health"}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))

    assert cli._read_spec_file(str(path)) == [spec]


# --- a field added to the declaration ------------------------------------------------------------


NEW = jobspec.JobField(
    "retries",
    jobspec.INT,
    0,
    0,
    5,
    label="Retries",
    help_text="How often a failed job is submitted again.",
    on_form=True,
)


def test_a_declared_field_appears_in_the_api_and_on_the_page_and_the_cli_test_sees_it():
    serializer = submit_serializer_class((*JOB_FIELDS, NEW))()
    form = submit_form_class((*FORM_FIELDS, NEW))

    api_field = serializer.fields["retries"]
    assert (api_field.min_value, api_field.max_value, api_field.default) == (0, 5, 0)
    assert api_field.help_text == NEW.help_text
    page_field = form.base_fields["retries"]
    assert (page_field.min_value, page_field.max_value, page_field.initial) == (0, 5, 0)
    assert (page_field.label, page_field.help_text) == ("Retries", NEW.help_text)
    assert cli_mismatches((*JOB_FIELDS, NEW)) == ["a spec file cannot give retries"]


def test_the_cli_check_sees_a_changed_bound_or_default():
    changed = tuple(
        dataclasses.replace(field, max_value=128, default=2)
        if field.name == "gpus_per_node"
        else field
        for field in JOB_FIELDS
    )
    found = cli_mismatches(changed)
    assert any("bounds" in line and "--gpus" in line for line in found), found
    assert any("default" in line and "--gpus" in line for line in found), found


# --- a service's replicas are jobs ---------------------------------------------------------------

#: The service's fields that become its replicas' job fields: {service field: job field}.
REPLICA_FIELDS = {
    "command": "command",
    "env": "env",
    "working_dir": "working_dir",
    "gpus_per_node": "gpus_per_node",
    "gpu_models": "gpu_model",
    "priority_class": "priority_class",
    "image": "image",
    "image_pull_policy": "image_pull_policy",
    "image_pull_secret": "image_pull_secret",
}


def _limits(built, kind) -> tuple:
    """The bounds a built serializer or form field puts on a value, in the declaration's terms."""
    if kind == jobspec.INT:
        return (built.min_value, built.max_value)
    if kind == jobspec.STRINGS:
        child = getattr(built, "child", None)
        return (child.max_length if child else built.max_value_length,)
    if kind == jobspec.MODELS:
        child = getattr(built, "child", None)
        return (child.max_length if child else None,)
    if kind == jobspec.CHOICE:
        return tuple(value for value in dict(built.choices) if value)
    if kind in (jobspec.TEXT, jobspec.CLASS, jobspec.COMMAND):
        return (getattr(built, "max_length", None),)
    return ()


def _declared_limits(field) -> tuple:
    if field.kind == jobspec.INT:
        return (field.min_value, field.max_value)
    if field.kind == jobspec.CHOICE:
        return tuple(value for value, _ in field.choices)
    return (field.max_length,)


@pytest.mark.parametrize(("service_name", "job_name"), REPLICA_FIELDS.items())
def test_a_services_replica_fields_have_the_job_specs_bounds(service_name, job_name):
    from inference.api.serializers import ServiceInputSerializer
    from inference.forms import ServiceForm

    field = FIELDS_BY_NAME[job_name]
    api_field = ServiceInputSerializer().fields[service_name]
    page_field = ServiceForm.base_fields[service_name]

    if field.kind != jobspec.COMMAND:  # the API's list of arguments: the service counts bytes
        assert _limits(api_field, field.kind) == _declared_limits(field)
    if field.kind not in (jobspec.MODELS, jobspec.CLASS):  # a comma list; a choice of objects
        assert _limits(page_field, field.kind) == _declared_limits(field)
