"""A service's own fields, declared once: name, default, bounds, label, help.

A service is its name, its description and the spec of its replicas (what each replica job
runs); its scaling settings are declared in ``inference.scaling``. The ``Service`` model,
the API's input and output serializers, the service form, the services' ``ServiceSpec``
and the field lists that say what a change does (``SPEC_FIELDS``: a new spec version) read
their defaults, bounds and help from ``SERVICE_FIELDS``; a test checks that they agree.

A replica is a job: where a field is one of the job's (``job_field``), its bounds and
choices are the job's (``scheduling.jobspec``), so that a service never takes a value that
its replicas' submission would refuse.

Standard library and ``scheduling.jobspec`` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduling.jobspec import FIELDS_BY_NAME as JOB_FIELDS
from scheduling.jobspec import REQUIRED


@dataclass(frozen=True, slots=True)
class ServiceField:
    """One field of a service. ``default`` ``REQUIRED``: a new service must give it.
    ``help_text``: the model's and the API's; ``form_help_text`` replaces it on the page
    where the page asks in another shape (a shell line, ``NAME=value`` lines, a comma
    list). ``in_spec``: changing it makes a new spec version (replicas replaced)."""

    name: str
    default: Any = REQUIRED
    max_length: int | None = None
    min_value: int | None = None
    max_value: int | None = None
    max_items: int | None = None
    choices: tuple[tuple[str, str], ...] = ()
    label: str = ""
    help_text: str = ""
    form_help_text: str | None = None
    empty_label: str = ""
    job_field: str = ""
    in_spec: bool = True

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def form_help(self) -> str:
        return self.help_text if self.form_help_text is None else self.form_help_text


def _as_job(name: str, job_field: str, **kwargs) -> ServiceField:
    """A field that the replica job carries too: its bounds and choices are the job's."""
    job = JOB_FIELDS[job_field]
    bounds = {
        "max_length": job.max_length,
        "min_value": job.min_value,
        "max_value": job.max_value,
        "choices": job.choices,
    }
    return ServiceField(name, job_field=job_field, **{**bounds, **kwargs})


#: In the order the API shows them.
SERVICE_FIELDS: tuple[ServiceField, ...] = (
    ServiceField(
        "queue",
        help_text="An inference queue of the tenant: its pool runs the replicas.",
    ),
    ServiceField(
        "name",
        max_length=50,
        form_help_text="Unique in the project, e.g. chat-7b.",
        in_spec=False,
    ),
    ServiceField("description", "", max_length=2000, in_spec=False),
    _as_job(
        "command",
        "command",
        help_text="Argument list of the model server.",
        form_help_text="The model server, run without a shell: it must read its port from the "
        "environment variable PORT (e.g. sh -c 'exec python -m vllm.entrypoints.openai."
        'api_server --port "$PORT"\'); a $PORT written in the command stays as written.',
    ),
    _as_job("env", "env", default={}, form_help_text="NAME=value lines."),
    _as_job("working_dir", "working_dir", default=""),
    _as_job(
        "gpus_per_node",
        "gpus_per_node",
        default=1,
        label="GPUs per replica",
        help_text="GPUs of each replica.",
    ),
    _as_job(
        "gpu_models",
        "gpu_model",
        default=[],
        max_items=16,
        label="GPU models",
        help_text="Acceptable GPU models; empty = any.",
        form_help_text="Comma list; empty: any.",
    ),
    _as_job(
        "priority_class",
        "priority_class",
        default=None,
        help_text="Empty: the queue's default class.",
        empty_label="queue default",
    ),
    ServiceField("health_path", "/health", max_length=200),
    ServiceField("metrics_path", "/metrics", max_length=200),
    _as_job(
        "image",
        "image",
        default="",
        label="Container image",
        help_text="The replicas' container image (pools whose executor runs images).",
    ),
    _as_job(
        "image_pull_policy",
        "image_pull_policy",
        default="",
        label="Image pull policy",
        empty_label="the executor's default",
    ),
    _as_job("image_pull_secret", "image_pull_secret", default="", label="Image pull secret"),
)

FIELDS_BY_NAME: dict[str, ServiceField] = {f.name: f for f in SERVICE_FIELDS}
NAMES: tuple[str, ...] = tuple(f.name for f in SERVICE_FIELDS)
#: Changing one of these makes a new spec version: its replicas replace the old ones.
SPEC_FIELDS: tuple[str, ...] = tuple(f.name for f in SERVICE_FIELDS if f.in_spec)
#: The default of every field a new service may leave out.
DEFAULTS: dict[str, Any] = {f.name: f.default for f in SERVICE_FIELDS if not f.required}
