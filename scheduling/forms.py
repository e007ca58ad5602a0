import json
import re
import shlex
from datetime import timedelta

from django import forms

from . import jobspec
from .choices import JobState, WorkloadType
from .selectors import priority_classes_visible_to

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|min|m|s)?", re.IGNORECASE)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "min": 60, "s": 1, None: 1}


def parse_duration(text: str) -> int:
    """``2h30m`` → 9000, ``90m`` → 5400, ``3600`` → 3600, ``1d 12h`` → 129600 (seconds).

    A bare number is seconds. Raises ValueError for anything else."""
    text = text.strip().lower().replace(" ", "")
    if not text:
        raise ValueError("empty")
    total, position = 0.0, 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            raise ValueError(text)
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position != len(text):
        raise ValueError(text)
    return round(total)


def format_duration(seconds) -> str:
    """9000 → ``2h30m``, 259200 → ``3d``, 45 → ``45s``: how durations are typed and shown."""
    if seconds is None or seconds == "":
        return ""
    seconds = int(round(float(seconds)))
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        value, seconds = divmod(seconds, size)
        if value:
            parts.append(f"{value}{unit}")
    return "".join(parts)


def command_arguments(raw: str) -> list[str]:
    """A command line split into arguments as a shell would, without running a shell
    (a form field's clean step: the job and service forms)."""
    try:
        args = shlex.split(raw.strip())
    except ValueError as exc:
        raise forms.ValidationError(f"The command cannot be split into arguments: {exc}.") from None
    if not args:
        raise forms.ValidationError("The command is empty.")
    return args


def env_from_lines(text: str) -> dict[str, str]:
    """``NAME=value`` lines (blank lines skipped) as a dict, or a field error naming the
    line that is not one."""
    env = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if "=" not in line:
            raise forms.ValidationError(f"Line {number} is not NAME=value.")
        key, value = line.split("=", 1)
        env[key.strip()] = value
    return env


class DurationInput(forms.TextInput):
    """Shows seconds as ``2h30m``."""

    def format_value(self, value):
        if isinstance(value, int | float) or (isinstance(value, str) and value.isdigit()):
            return format_duration(value)
        return super().format_value(value)


class DurationField(forms.Field):
    """A duration typed as ``2h30m``, ``90m``, ``1d`` or seconds (``3600``); cleans to seconds
    within ``min_value``..``max_value``."""

    widget = DurationInput
    default_error_messages = {
        "invalid": "Type a duration such as 2h30m, 90m, 1d or a number of seconds.",
        "min_value": "At least %(limit)s.",
        "max_value": "At most %(limit)s.",
    }

    def __init__(self, *, min_value: int = 1, max_value: int | None = None, **kwargs):
        self.min_value, self.max_value = min_value, max_value
        super().__init__(**kwargs)

    def to_python(self, value):
        if value in self.empty_values:
            return None
        if isinstance(value, int):
            seconds = value
        elif isinstance(value, timedelta):
            seconds = int(value.total_seconds())
        else:
            try:
                seconds = parse_duration(str(value))
            except ValueError:
                raise forms.ValidationError(
                    self.error_messages["invalid"], code="invalid"
                ) from None
        for code, limit, beyond in (
            ("min_value", self.min_value, seconds < (self.min_value or 0)),
            ("max_value", self.max_value, self.max_value is not None and seconds > self.max_value),
        ):
            if beyond:
                raise forms.ValidationError(
                    self.error_messages[code],
                    code=code,
                    params={"limit": f"{limit} second" + ("" if limit == 1 else "s")},
                )
        return seconds


class NameValueLinesField(forms.CharField):
    """``NAME=value`` lines (blank lines skipped), cleaned to a dict; ``max_value_length``
    bounds each value."""

    widget = forms.Textarea(attrs={"rows": 2})

    def __init__(self, *, max_value_length: int | None = None, **kwargs):
        self.max_value_length = max_value_length
        super().__init__(**kwargs)

    def clean(self, value):
        values = env_from_lines(super().clean(value) or "")
        too_long = [k for k, v in values.items() if len(v) > (self.max_value_length or len(v))]
        if too_long:
            raise forms.ValidationError(
                f"The value of {too_long[0]} is longer than {self.max_value_length} characters."
            )
        return values


class ModelKeysField(forms.CharField):
    """GPU model keys, one or a comma list (``max_key_length`` each), cleaned to a list;
    empty: any."""

    def __init__(self, *, max_key_length: int, **kwargs):
        self.max_key_length = max_key_length
        super().__init__(**kwargs)

    def clean(self, value):
        keys = [m.strip() for m in (super().clean(value) or "").split(",") if m.strip()]
        if any(len(m) > self.max_key_length for m in keys):
            raise forms.ValidationError(
                f"A GPU model key has at most {self.max_key_length} characters."
            )
        return keys


class OptionDataSelect(forms.Select):
    """A select whose options carry ``data-*`` attributes (``option_data[value]``), for the
    submit page's script (static/js/sluice.js) to show only what the chosen queue's pool has."""

    def __init__(self, *args, option_data=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.option_data = option_data or {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        key = getattr(value, "value", value)
        option["attrs"].update(self.option_data.get(str(key), {}))
        return option


def submit_form_field(field: jobspec.JobField) -> forms.Field:
    """The submit page's field for a declared job field (scheduling/jobspec.py)."""
    common = {"label": field.label, "help_text": jobspec.help_for_form(field)}
    optional = not field.required
    kind = field.kind
    if kind == jobspec.ID:
        return forms.ModelChoiceField(queryset=None, widget=OptionDataSelect, **common)
    if kind == jobspec.CLASS:
        return forms.ModelChoiceField(
            queryset=None, required=False, empty_label=field.empty_label, **common
        )
    if kind == jobspec.TEXT:
        return forms.CharField(max_length=field.max_length, required=False, **common)
    if kind == jobspec.CHOICE:
        blank = [("", field.empty_label)] if optional else []
        return forms.ChoiceField(
            choices=[*blank, *field.choices],
            required=not optional,
            initial=field.initial if field.required else field.default,
            **common,
        )
    if kind == jobspec.BOOL:
        return forms.BooleanField(required=False, initial=field.default, **common)
    if kind == jobspec.INT:
        return forms.IntegerField(
            min_value=field.min_value,
            max_value=field.max_value,
            required=not field.nullable,
            initial=field.default,
            **common,
        )
    if kind == jobspec.DURATION:
        return DurationField(
            min_value=field.min_value, max_value=field.max_value, required=False, **common
        )
    if kind == jobspec.COMMAND:
        # The page takes a shell line (cleaned by the form: split unless "shell" is ticked).
        return forms.CharField(
            max_length=field.max_length, widget=forms.Textarea(attrs={"rows": 2}), **common
        )
    if kind == jobspec.STRINGS:
        return NameValueLinesField(max_value_length=field.max_length, required=False, **common)
    if kind == jobspec.OBJECT:
        return forms.JSONField(required=False, initial=dict, **common)
    if kind == jobspec.MODELS:
        choices = [("", field.empty_label)]  # the pool's models are added per page
        return ModelKeysField(
            max_key_length=field.max_length,
            required=False,
            widget=OptionDataSelect(choices=choices),
            **common,
        )
    raise ValueError(f"{field.name}: no form field for the kind {kind!r}")


class JobSubmitChecks(forms.Form):
    """The submit page's steps; ``JobSubmitForm`` adds the declared fields. The command is
    typed as a shell line and split like a shell would (shlex), unless "run through a
    shell" is ticked."""

    def __init__(self, *args, projects, queues, priority_classes, pool_models=None, **kwargs):
        """``pool_models``: {pool id: {model: GPUs on its largest node}} (the models offered)."""
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects
        self.fields["queue"].queryset = queues
        self.fields["priority_class"].queryset = priority_classes
        pool_models = pool_models or {}
        self.fields["queue"].widget.option_data = {
            str(q.pk): {"data-pool": str(q.pool_id)} for q in queues
        }
        models: dict[str, list[str]] = {}
        largest: dict[str, int] = {}
        for pool_id, shapes in pool_models.items():
            for model, per_node in shapes.items():
                models.setdefault(model, []).append(str(pool_id))
                largest[model] = max(largest.get(model, 0), per_node)
        widget = self.fields["gpu_model"].widget
        widget.choices = [widget.choices[0], *((m, m) for m in sorted(models))]
        widget.option_data = {
            m: {"data-pools": " ".join(pools), "data-per-node": str(largest[m])}
            for m, pools in models.items()
        }

    def clean_command(self):
        raw = self.cleaned_data["command"].strip()
        if self.data.get("shell") in ("on", "true", "1"):
            return [raw]
        return command_arguments(raw)


def submit_form_class(fields=jobspec.FORM_FIELDS) -> type[forms.Form]:
    """The submit form with one field per declared job field the page asks for, made
    through Django's form metaclass as a class statement would be."""
    return type(JobSubmitChecks)(
        "JobSubmitForm",
        (JobSubmitChecks,),
        {
            "__module__": __name__,
            "__qualname__": "JobSubmitForm",
            "__doc__": "The submit page: the fields of scheduling/jobspec.py it asks for.",
            **{field.name: submit_form_field(field) for field in fields},
        },
    )


JobSubmitForm = submit_form_class()


SINCE_CHOICES = [
    ("", "any time"),
    ("1h", "last hour"),
    ("1d", "last day"),
    ("7d", "last week"),
    ("30d", "last 30 days"),
]
SORTS = {
    "id": "id",
    "name": "name",
    "state": "state",
    "queue": "queue__name",
    "gpus": "gpus_per_node",
    "user": "submitted_by__username",
    "class": "priority_class__value",
}


class JobFilterForm(forms.Form):
    """The jobs list's filters; every choice is scoped to what the user sees."""

    q = forms.CharField(required=False, max_length=100, label="Name contains")
    state = forms.ChoiceField(choices=[("", "any state"), *JobState.choices], required=False)
    queue = forms.ModelChoiceField(queryset=None, required=False, empty_label="any queue")
    project = forms.ModelChoiceField(queryset=None, required=False, empty_label="any project")
    tenant = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="any tenant", to_field_name="slug"
    )
    user = forms.CharField(required=False, max_length=150, label="User")
    workload_type = forms.ChoiceField(
        choices=[("", "any type"), *WorkloadType.choices], required=False, label="Type"
    )
    since = forms.ChoiceField(choices=SINCE_CHOICES, required=False, label="Submitted")
    mine = forms.BooleanField(required=False, initial=True, label="Only mine")
    sort = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, queues, projects, tenants, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["queue"].queryset = queues.select_related("tenant")
        self.fields["project"].queryset = projects.select_related("tenant")
        self.fields["tenant"].queryset = tenants
        for name in ("q", "user"):
            self.fields[name].widget.attrs["size"] = 12

    def order_by(self) -> list[str]:
        """The sort the user asked for (``-name``: descending), newest first otherwise.
        Ties go by id the same way as the column, so that one index on (column, id), read
        forwards or backwards, serves both directions (job_state_gpus)."""
        value = (self.cleaned_data.get("sort") or "") if self.is_bound else ""
        descending = value.startswith("-")
        column = SORTS.get(value.lstrip("-"))
        if column is None:
            return ["-id"]
        if column == "id":
            return ["-id" if descending else "id"]
        if descending:
            return [f"-{column}", "-id"]
        return [column, "id"]

    def since_delta(self) -> timedelta | None:
        value = self.cleaned_data.get("since")
        return timedelta(seconds=parse_duration(value)) if value else None


class BulkActionForm(forms.Form):
    """Cancel or hold the jobs ticked in the list."""

    job = forms.TypedMultipleChoiceField(coerce=int, choices=())
    step = forms.ChoiceField(
        choices=[("cancel", "cancel"), ("hold", "hold"), ("release", "release")]
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        ids = self.data.getlist("job") if hasattr(self.data, "getlist") else []
        self.fields["job"].choices = [(i, i) for i in ids if str(i).isdigit()][:500]


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


class RaiseRequestForm(forms.Form):
    """The job page's small "request a raise" form; the service checks the rest."""

    to_class = forms.ModelChoiceField(queryset=None, label="Target class", empty_label=None)
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    hours = forms.FloatField(
        required=False, label="Hours", help_text="Empty: the longest the class allows."
    )

    def __init__(self, *args, user, job, **kwargs):
        super().__init__(*args, **kwargs)
        # Only classes above the job's current one are offered.
        self.fields["to_class"].queryset = (
            priority_classes_visible_to(user)
            .filter(value__gt=job.priority_class.value)
            .order_by("value")
        )
