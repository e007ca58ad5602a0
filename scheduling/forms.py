import json
import shlex

from django import forms

from .choices import JobState, WorkloadType
from .selectors import priority_classes_visible_to


class JobSubmitForm(forms.Form):
    """The submit page. The command is typed as a shell line and split like a shell would
    (shlex), unless "run through a shell" is ticked."""

    project = forms.ModelChoiceField(queryset=None)
    queue = forms.ModelChoiceField(queryset=None)
    name = forms.CharField(max_length=120, required=False)
    workload_type = forms.ChoiceField(choices=WorkloadType.choices, initial=WorkloadType.TRAINING)
    gpu_model = forms.CharField(
        max_length=40, required=False, help_text="Empty: any model in the queue's pool."
    )
    gpus_per_node = forms.IntegerField(min_value=0, max_value=64, initial=1)
    nodes = forms.IntegerField(min_value=1, max_value=256, initial=1)
    max_runtime_seconds = forms.IntegerField(
        min_value=1, required=False, help_text="Empty: the policy default."
    )
    priority_class = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="queue default"
    )
    command = forms.CharField(
        max_length=65536,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="e.g. python train.py --epochs 3",
    )
    shell = forms.BooleanField(required=False, label="Run through a shell (/bin/sh -c)")
    env = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="One NAME=value per line.",
    )

    def __init__(self, *args, projects, queues, priority_classes, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects
        self.fields["queue"].queryset = queues
        self.fields["priority_class"].queryset = priority_classes

    def clean_command(self):
        raw = self.cleaned_data["command"].strip()
        if self.data.get("shell") in ("on", "true", "1"):
            return [raw]
        try:
            args = shlex.split(raw)
        except ValueError as exc:
            raise forms.ValidationError(
                f"The command cannot be split into arguments: {exc}."
            ) from None
        if not args:
            raise forms.ValidationError("The command is empty.")
        return args

    def clean_env(self):
        env = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            if not line.strip():
                continue
            if "=" not in line:
                raise forms.ValidationError(f"Line {number} is not NAME=value.")
            key, value = line.split("=", 1)
            env[key.strip()] = value
        return env

    def clean_gpu_model(self):
        value = self.cleaned_data["gpu_model"].strip()
        return [m.strip() for m in value.split(",") if m.strip()]


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(choices=[("", "any state"), *JobState.choices], required=False)
    workload_type = forms.ChoiceField(
        choices=[("", "any type"), *WorkloadType.choices], required=False
    )
    mine = forms.BooleanField(required=False, initial=True, label="Only mine")
    q = forms.CharField(required=False, max_length=100, label="Name contains")


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


class RaiseStepForm(forms.Form):
    """Approve, reject, revoke or cancel a raise, with an optional comment."""

    comment = forms.CharField(max_length=2000, required=False)
