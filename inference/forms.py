"""The service form (create and edit): the command typed as a shell line, env as lines."""

from __future__ import annotations

import shlex

from django import forms

from scheduling.choices import ImagePullPolicy
from scheduling.forms import NameValueLinesField, command_arguments
from scheduling.jobspec import FIELDS_BY_NAME as JOB_FIELDS

from .scaling import form_field as scaling_field
from .services import EDITABLE_FIELDS


class ServiceForm(forms.Form):
    """Create a service (every field) or edit one (project and name fixed)."""

    project = forms.ModelChoiceField(queryset=None)
    queue = forms.ModelChoiceField(
        queryset=None, help_text="An inference queue: its pool runs the replicas."
    )
    name = forms.SlugField(max_length=50, help_text="Unique in the project, e.g. chat-7b.")
    description = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2})
    )
    command = forms.CharField(
        max_length=65536,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="The model server, run without a shell: it must read its port from the "
        "environment variable PORT (e.g. sh -c 'exec python -m vllm.entrypoints.openai."
        'api_server --port "$PORT"\'); a $PORT written in the command stays as written.',
    )
    env = NameValueLinesField(
        max_value_length=JOB_FIELDS["env"].max_length,
        required=False,
        help_text="NAME=value lines.",
    )
    working_dir = forms.CharField(required=False, max_length=500)
    gpus_per_node = forms.IntegerField(
        min_value=0, max_value=64, initial=1, label="GPUs per replica"
    )
    gpu_models = forms.CharField(
        required=False, max_length=200, label="GPU models", help_text="Comma list; empty: any."
    )
    priority_class = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="queue default"
    )
    health_path = forms.CharField(max_length=200, initial="/health")
    metrics_path = forms.CharField(max_length=200, initial="/metrics")
    image = forms.CharField(
        required=False,
        max_length=255,
        label="Container image",
        help_text="Only where the queue's pool runs images (Kubernetes, Slurm with pyxis).",
    )
    image_pull_policy = forms.ChoiceField(
        choices=[("", "the executor's default"), *ImagePullPolicy.choices],
        required=False,
        label="Image pull policy",
    )
    image_pull_secret = forms.CharField(required=False, max_length=253, label="Image pull secret")
    # Scaling settings: bounds, defaults, labels and help from inference/scaling.py.
    min_replicas = scaling_field("min_replicas")
    max_replicas = scaling_field("max_replicas")
    target_running_per_replica = scaling_field("target_running_per_replica")
    latency_slo_ms = scaling_field("latency_slo_ms")
    error_rate_max = scaling_field("error_rate_max")
    gpu_util_max = scaling_field("gpu_util_max")
    stable_window_s = scaling_field("stable_window_s")
    panic_window_s = scaling_field("panic_window_s")
    panic_threshold = scaling_field("panic_threshold")
    scale_up_max_step = scaling_field("scale_up_max_step")
    scale_down_delay_s = scaling_field("scale_down_delay_s")
    scale_to_zero = scaling_field("scale_to_zero")
    scale_to_zero_grace_s = scaling_field("scale_to_zero_grace_s")

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
