"""The service form (create and edit): the command typed as a shell line, env as lines."""

from __future__ import annotations

import shlex

from django import forms

from scheduling.forms import NameValueLinesField, command_arguments

from .scaling import form_field as scaling_field
from .scaling import with_settings
from .services import EDITABLE_FIELDS
from .spec import FIELDS_BY_NAME as SPEC


class ServiceFormChecks(forms.Form):
    """A service's own fields as the page asks for them, and how they are cleaned;
    ``ServiceForm`` adds the scaling settings (inference/scaling.py)."""

    project = forms.ModelChoiceField(queryset=None)
    queue = forms.ModelChoiceField(queryset=None, help_text=SPEC["queue"].form_help)
    name = forms.SlugField(max_length=SPEC["name"].max_length, help_text=SPEC["name"].form_help)
    description = forms.CharField(
        required=False,
        max_length=SPEC["description"].max_length,
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    command = forms.CharField(
        max_length=SPEC["command"].max_length,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=SPEC["command"].form_help,
    )
    env = NameValueLinesField(
        max_value_length=SPEC["env"].max_length,
        required=False,
        help_text=SPEC["env"].form_help,
    )
    working_dir = forms.CharField(required=False, max_length=SPEC["working_dir"].max_length)
    gpus_per_node = forms.IntegerField(
        min_value=SPEC["gpus_per_node"].min_value,
        max_value=SPEC["gpus_per_node"].max_value,
        initial=SPEC["gpus_per_node"].default,
        label=SPEC["gpus_per_node"].label,
        help_text=SPEC["gpus_per_node"].form_help,
    )
    # Typed as one comma-separated line.
    gpu_models = forms.CharField(
        required=False,
        max_length=200,
        label=SPEC["gpu_models"].label,
        help_text=SPEC["gpu_models"].form_help,
    )
    priority_class = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label=SPEC["priority_class"].empty_label,
        help_text=SPEC["priority_class"].form_help,
    )
    health_path = forms.CharField(
        max_length=SPEC["health_path"].max_length, initial=SPEC["health_path"].default
    )
    metrics_path = forms.CharField(
        max_length=SPEC["metrics_path"].max_length, initial=SPEC["metrics_path"].default
    )
    image = forms.CharField(
        required=False,
        max_length=SPEC["image"].max_length,
        label=SPEC["image"].label,
        help_text=SPEC["image"].form_help,
    )
    image_pull_policy = forms.ChoiceField(
        choices=[("", SPEC["image_pull_policy"].empty_label), *SPEC["image_pull_policy"].choices],
        required=False,
        label=SPEC["image_pull_policy"].label,
    )
    image_pull_secret = forms.CharField(
        required=False,
        max_length=SPEC["image_pull_secret"].max_length,
        label=SPEC["image_pull_secret"].label,
    )

    def __init__(self, *args, projects, queues, priority_classes, editing=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects
        self.fields["queue"].queryset = queues
        self.fields["priority_class"].queryset = priority_classes
        self.editing = editing
        if editing:
            for name in ("project", "name"):
                self.fields[name].disabled = True
                self.fields[name].required = False

    def clean_command(self):
        return command_arguments(self.cleaned_data["command"])

    def clean_gpu_models(self):
        return [m.strip() for m in self.cleaned_data["gpu_models"].split(",") if m.strip()]

    def clean(self):
        data = super().clean()
        lo, hi = data.get("min_replicas"), data.get("max_replicas")
        if lo is not None and hi is not None and lo > hi:
            self.add_error("min_replicas", "Must not be above max replicas.")
        return data

    def changes(self) -> dict:
        """The editable fields, as the services take them."""
        return {k: self.cleaned_data[k] for k in EDITABLE_FIELDS if k in self.cleaned_data}


ServiceForm = with_settings(
    ServiceFormChecks,
    scaling_field,
    name="ServiceForm",
    doc="Create a service (every field) or edit one (project and name fixed).",
)


def initial_from(service) -> dict:
    """The edit form filled from a service."""
    values = {name: getattr(service, name) for name in EDITABLE_FIELDS}
    values.update(
        project=service.project_id,
        name=service.name,
        queue=service.queue_id,
        priority_class=service.priority_class_id,
        command=shlex.join(service.command),
        env="\n".join(f"{k}={v}" for k, v in service.env.items()),
        gpu_models=", ".join(service.gpu_models),
    )
    return values
