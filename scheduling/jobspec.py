"""A job's submitted fields, declared once: name, kind, default, bounds, choices, label, help.

The submit API's serializer (``scheduling.api.serializers.JobSubmitSerializer``, which the
bulk endpoint takes a list of) and the submit page's form (``scheduling.forms.JobSubmitForm``)
are built from ``JOB_FIELDS``; change a default, a bound or a help text here and both follow.
The ``Job`` model's columns take their help texts, lengths and defaults from it
(``column_help``). The spec the services take (``scheduling.services.jobs.JobSpec``), the
``Job`` model's columns and the command-line client's flags (``sluice_cli``, installed
without the server, so it cannot read this module) are checked against it by
``tests/scheduling/test_jobspec_declared_once.py``.

Standard library and ``scheduling.choices`` only: the builders live with the serializer and
the form, which know their field classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .choices import ImagePullPolicy, WorkloadType

# The largest values the database columns hold (PositiveIntegerField, BigIntegerField).
MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1

# What a field holds, and so which field class the serializer and the form build for it.
ID = "id"  # a project or queue, by id (the page offers a list)
TEXT = "text"  # a string, blank allowed
CHOICE = "choice"  # one of ``choices``
BOOL = "bool"
INT = "int"  # a whole number within ``min_value``..``max_value``
DURATION = "duration"  # seconds (the page and the CLI take 2h30m)
COMMAND = "command"  # an argument list, or one shell string with ``shell``
STRINGS = "strings"  # an object of string values (``max_length`` each)
OBJECT = "object"  # any JSON object
MODELS = "models"  # GPU model keys (``max_length`` each): one, a list, or empty for any
CLASS = "class"  # a priority class, by name (the page offers a list)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a field that a submission must give.
REQUIRED: Any = _Required()


@dataclass(frozen=True, slots=True)
class JobField:
    """One field of a submitted job spec.

    ``default``: what an absent field means (``REQUIRED``: it must be given; None with
    ``nullable``: "none", or the workload type's default for the runtime limit). ``max_length``
    counts characters of text, bytes of a command, or characters of each value of an object
    of strings or of each GPU model key. ``help_text`` says what the field means;
    ``form_help_text`` replaces it on the page where the page asks for it in another shape
    (a shell line, ``NAME=value`` lines). ``empty_label``: what the page shows for "not
    given"; ``initial``: what the page preselects, and the CLI picks, for a field the API
    requires. ``spec_name``: its name in ``JobSpec`` and on the ``Job`` model, where that
    differs. ``on_form``: the submit page asks for it (the API takes every field).
    """

    name: str
    kind: str
    default: Any = REQUIRED
    min_value: int | None = None
    max_value: int | None = None
    max_length: int | None = None
    choices: tuple[tuple[str, str], ...] = ()
    nullable: bool = False
    label: str = ""
    help_text: str = ""
    form_help_text: str | None = None
    empty_label: str = ""
    initial: Any = None
    spec_name: str = ""
    on_form: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def attribute(self) -> str:
        """The field's name in ``JobSpec`` and on the ``Job`` model."""
        return self.spec_name or self.name


#: In the submit page's order; the API takes them all, the page those ``on_form``.
JOB_FIELDS: tuple[JobField, ...] = (
    JobField("project", ID, label="Project", on_form=True),
    JobField(
        "queue",
        ID,
        label="Queue",
        help_text="Where the job waits; it runs in the queue's resource pool.",
        on_form=True,
    ),
    JobField(
        "name",
        TEXT,
        "",
        max_length=120,
        label="Name",
        help_text="Shown in lists; e.g. bert-pretrain-lr3e-4. Empty: the start of the command.",
        on_form=True,
    ),
    JobField(
        "workload_type",
        CHOICE,
        choices=tuple(WorkloadType.choices),
        label="Workload type",
        help_text="Sets the runtime limits, preemption and idle reclaim.",
        form_help_text="Sets the runtime limits, preemption and idle reclaim (table below).",
        initial=WorkloadType.TRAINING.value,
        on_form=True,
    ),
    JobField(
        "gpu_model",
        MODELS,
        [],
        max_length=40,
        label="GPU model",
        help_text="The GPU models the job accepts, one model key or a list; empty: any model "
        "of the queue's pool, whichever is free first.",
        form_help_text="The models of the queue's pool; any: whichever is free first.",
        empty_label="any model of the pool",
        spec_name="gpu_models",
        on_form=True,
    ),
    JobField(
        "gpus_per_node",
        INT,
        1,
        0,
        64,
        label="GPUs per node",
        help_text="All on one node; 0 for CPU-only work.",
        on_form=True,
    ),
    JobField(
        "nodes",
        INT,
        1,
        1,
        256,
        label="Nodes",
        help_text="More than 1: a multi-node job gets nodes × GPUs per node, all at once.",
        on_form=True,
    ),
    JobField(
        "min_gpu_memory_mb",
        INT,
        0,
        0,
        MAX_INT32,
        label="Minimum GPU memory (MB)",
        help_text="Only GPUs with at least this much memory (MB); 0: any.",
    ),
    JobField(
        "cpus",
        INT,
        1,
        1,
        1024,
        label="CPUs",
        help_text="CPU cores the job asks for, kept with it (the node's limits come from the "
        "workload type's policy).",
    ),
    JobField(
        "memory_mb",
        INT,
        0,
        0,
        MAX_INT32,
        label="Memory (MB)",
        help_text="Memory the job asks for, kept with it; 0: not said (the node's limits come "
        "from the workload type's policy).",
    ),
    JobField(
        "max_runtime_seconds",
        DURATION,
        None,
        1,
        MAX_INT32,
        nullable=True,
        label="Maximum runtime",
        help_text="The job is stopped when it is reached; not given: the workload type's default.",
        on_form=True,
    ),
    JobField(
        "priority_class",
        CLASS,
        "",
        max_length=50,
        label="Priority class",
        help_text="Above the queue's self-service maximum: ask for a raise on the job page.",
        empty_label="queue default",
        on_form=True,
    ),
    JobField(
        "command",
        COMMAND,
        max_length=64 * 1024,
        label="Command",
        help_text='Argument list, e.g. ["python", "train.py"]; a string only with shell=true.',
        form_help_text="e.g. python train.py --epochs 3",
        on_form=True,
    ),
    JobField(
        "shell",
        BOOL,
        False,
        label="Run through a shell (/bin/sh -c)",
        help_text="The command is one line that /bin/sh -c runs.",
        on_form=True,
    ),
    JobField(
        "env",
        STRINGS,
        {},
        max_length=8192,
        label="Env",
        help_text="Environment variables: an object of NAME: value strings.",
        form_help_text="One NAME=value per line.",
        on_form=True,
    ),
    JobField(
        "working_dir",
        TEXT,
        "",
        max_length=500,
        label="Working directory",
        help_text="Where the command starts, relative to the job's workspace on the node (an "
        "absolute one only under a root the operator allows); empty: the workspace.",
    ),
    JobField(
        "checkpoint_dir",
        TEXT,
        "",
        max_length=500,
        label="Checkpoint directory",
        help_text="Where the job keeps its checkpoints, given to it as SLUICE_CHECKPOINT_DIR "
        "(relative like working_dir); empty: workspace/checkpoints.",
    ),
    JobField(
        "image",
        TEXT,
        "",
        max_length=255,
        label="Container image",
        help_text="e.g. registry.example.com/team/train:1.0 or img@sha256:<digest>; only where "
        "the queue's pool runs images (Kubernetes, or Slurm with pyxis). Empty: the command "
        "runs on the node.",
        on_form=True,
    ),
    JobField(
        "image_pull_policy",
        CHOICE,
        "",
        choices=tuple(ImagePullPolicy.choices),
        label="Image pull policy",
        help_text="When the node pulls the image; empty: the executor's default.",
        empty_label="the executor's default",
        on_form=True,
    ),
    JobField(
        "image_pull_secret",
        TEXT,
        "",
        max_length=253,
        label="Image pull secret",
        help_text="The name of the registry credential secret, if the registry needs one.",
        on_form=True,
    ),
    JobField(
        "labels",
        STRINGS,
        {},
        max_length=200,
        label="Labels",
        help_text="Your own NAME: value strings, kept with the job.",
    ),
    JobField("dataset", TEXT, "", max_length=200, label="Dataset"),
    JobField("dataset_version", TEXT, "", max_length=100, label="Dataset version"),
    JobField(
        "code_ref", TEXT, "", max_length=200, label="Code reference", help_text="e.g. a git commit"
    ),
    JobField("parameters", OBJECT, {}, label="Parameters", help_text="Your own JSON object."),
    JobField("seed", INT, None, -MAX_INT64 - 1, MAX_INT64, nullable=True, label="Seed"),
    JobField(
        "array",
        INT,
        None,
        1,
        10_000,
        nullable=True,
        label="Array",
        help_text="Submit this many copies; each gets SLUICE_ARRAY_INDEX 0..N-1.",
    ),
    JobField(
        "serve",
        OBJECT,
        {},
        label="Serve",
        help_text="Makes the job an HTTP replica (inference, batch_inference, interactive): "
        '{"health_path": "/health", "metrics_path": "/metrics"}; its node\'s agent gives it a '
        "port (env PORT) and scrapes both paths. Empty: not a serving job.",
    ),
)

FIELDS_BY_NAME: dict[str, JobField] = {f.name: f for f in JOB_FIELDS}
NAMES: tuple[str, ...] = tuple(f.name for f in JOB_FIELDS)
#: The fields the submit page asks for, in its order.
FORM_FIELDS: tuple[JobField, ...] = tuple(f for f in JOB_FIELDS if f.on_form)


def help_for_api(field: JobField) -> str:
    """The API's description of a field: its meaning, with the unit where the page's differs."""
    if field.kind == ID:
        return f"{field.label} id." + (f" {field.help_text}" if field.help_text else "")
    if field.kind == DURATION:
        return f"In seconds. {field.help_text}"
    return field.help_text


def help_for_form(field: JobField) -> str:
    """The page's help under a field."""
    if field.form_help_text is not None:
        return field.form_help_text
    if field.kind == DURATION:
        return f"e.g. 2h30m, 90m, 1d. {field.help_text}"
    return field.help_text


def column_help(name: str) -> str:
    """The help of the ``Job`` column that keeps a declared field: the API's description."""
    return help_for_api(FIELDS_BY_NAME[name])
