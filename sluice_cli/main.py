"""``sluice``: submit, watch and manage jobs from a shell, through the REST API only.

Exit codes (scripts may rely on them):

    0  done
    1  the API refused the request (4xx other than 401 and 404: bad input, a role that may
       not do it, a job in a state that does not allow it)
    2  usage error (bad flags, an unreadable spec file, an ambiguous name)
    3  not found (a job, queue, project or raise that does not exist or that you cannot see)
    4  not logged in, or the token was refused (401; wrong password at ``login``)
    5  server error (5xx) or the server cannot be reached
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from . import __version__
from .client import (
    EXIT_AUTH,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    MAX_PAGE_SIZE,
    ApiError,
    Client,
    CliError,
)
from .config import ConfigError, Settings, config_save, settings_load
from .output import (
    clip,
    fmt_ago,
    fmt_duration,
    fmt_local,
    fmt_when,
    parse_duration,
    table,
)

FINAL_STATES = frozenset(
    {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "RECLAIMED", "PREEMPTED", "LOST"}
)
ACTIVE_STATES = frozenset({"ADMITTED", "RUNNING", "STOPPING"})
JOB_STATES = ("PENDING", "HELD", *sorted(ACTIVE_STATES), *sorted(FINAL_STATES))
RAISE_STATES = ("pending", "approved", "rejected", "expired", "revoked", "cancelled")


class UsageError(CliError):
    def __init__(self, message: str):
        super().__init__(message, EXIT_USAGE)


@dataclass
class Context:
    settings: Settings
    client: Client
    json: bool
    env: Mapping[str, str]
    cache: dict = field(default_factory=dict)

    def emit(self, data: Any, human: Callable[[], str | None]) -> None:
        """The API's JSON with ``--json``, else the human text."""
        if self.json:
            print(json.dumps(data, indent=2, ensure_ascii=False))
        else:
            text = human()
            if text:
                print(text)


# --- helpers ----------------------------------------------------------------------------------


def _key_values(items: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} {item!r}: write KEY=VALUE")
        out[key] = value
    return out


def _split_list(values: list[str] | None, upper: bool = False) -> list[str]:
    out = []
    for value in values or []:
        out += [v.strip().upper() if upper else v.strip() for v in value.split(",") if v.strip()]
    return out


def _job_id(text: str, what: str = "job") -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise UsageError(f"{text!r} is not a {what} id (a whole number)")
    return int(text)


def _username(ctx: Context) -> str:
    """Who the token belongs to: remembered by `login`, else asked of the API."""
    if ctx.settings.username:
        return ctx.settings.username
    if "username" not in ctx.cache:
        tokens = ctx.client.get("auth/tokens", page_size=1)
        rows = tokens.get("results", []) if isinstance(tokens, dict) else tokens
        ctx.cache["username"] = rows[0]["user"] if rows else None
    if not ctx.cache["username"]:
        raise UsageError("cannot tell who you are: give --user NAME or --all")
    return ctx.cache["username"]


def _resolve(ctx: Context, kind: str, ref: Any, *, tenant: str | None = None) -> dict:
    """A queue or project named by id, NAME or TENANT/NAME (a project by its slug)."""
    path, key, label = {
        "queue": ("queues", "name", "queue"),
        "project": ("projects", "slug", "project"),
    }[kind]
    text = str(ref).strip()
    cache_key = (kind, text, tenant)
    if cache_key in ctx.cache:
        return ctx.cache[cache_key]
    if text.isdigit():
        try:
            found = ctx.client.get(f"{path}/{text}")
        except ApiError as exc:
            if exc.exit_code == EXIT_NOT_FOUND:
                raise CliError(f"no {label} with id {text}", EXIT_NOT_FOUND) from None
            raise
    else:
        owner, _, name = text.rpartition("/")
        params: dict[str, Any] = {"tenant__slug": owner or tenant}
        if kind == "project":
            params["slug"] = name
        rows = [r for r in ctx.client.paginate(path, **params) if r[key] == name]
        if not rows:
            where = f" in tenant {owner or tenant}" if owner or tenant else ""
            raise CliError(
                f"no {label} named {name!r}{where} (see `sluice {path}`)"
                if kind == "queue"
                else f"no {label} named {name!r}{where}",
                EXIT_NOT_FOUND,
            )
        if len(rows) > 1:
            choices = ", ".join(f"{r['tenant']}/{r[key]} (id {r['id']})" for r in rows)
            raise UsageError(
                f"{label} {name!r} is ambiguous: {choices}; write TENANT/{name} or the id"
            )
        found = rows[0]
    ctx.cache[cache_key] = found
    return found


# --- login ------------------------------------------------------------------------------------


def cmd_login(ctx: Context, args: argparse.Namespace) -> int:
    import getpass

    username = (args.username or ctx.env.get("SLUICE_USERNAME") or "").strip()
    if args.password_stdin:
        # stdin holds the password: the username cannot be asked for there too.
        if not username:
            raise UsageError(
                "--password-stdin reads only the password: give the username with "
                "--username NAME or SLUICE_USERNAME"
            )
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise UsageError("--password-stdin: no password on stdin")
    else:
        username = username or input("Username: ").strip()
        password = getpass.getpass("Password: ")
    body: dict[str, Any] = {
        "username": username,
        "password": password,
        "name": f"sluice-cli@{socket.gethostname()}"[:100],
    }
    if args.days:
        body["expires_in_days"] = args.days
    try:
        data = ctx.client.request("POST", "auth/token", body=body, auth=False)
    except ApiError as exc:
        if exc.status == 400 and "non_field_errors" in ((exc.body or {}).get("errors") or {}):
            raise CliError(f"login refused: {exc.message}", EXIT_AUTH, exc.body) from None
        raise
    stored = dict(ctx.settings.stored)
    _revoke_saved_token(stored, quiet=True)  # the one this login replaces
    stored.update(
        url=ctx.settings.url,
        token=data["token"],
        token_id=data.get("id"),
        username=data.get("user", username),
        expiry=data.get("expiry"),
    )
    config_save(ctx.settings.path, stored)
    public = {k: v for k, v in data.items() if k != "token"}
    ctx.emit(
        {**public, "config": str(ctx.settings.path)},
        lambda: (
            f"Logged in to {ctx.settings.url} as {stored['username']}; token saved in "
            f"{ctx.settings.path} (expires {fmt_local(data.get('expiry'))})"
        ),
    )
    if ctx.env.get("SLUICE_TOKEN"):
        print("note: SLUICE_TOKEN is set and is used instead of the saved token", file=sys.stderr)
    return EXIT_OK


def _revoke_saved_token(stored: dict, *, quiet: bool) -> bool:
    """Revoke the saved token on its server (best effort: an expired or revoked one is fine)
    with ``DELETE /api/v1/auth/token``: the token ends itself."""
    if not (stored.get("token") and stored.get("url")):
        return False
    client = Client(stored["url"], stored["token"], timeout=10)
    try:
        try:
            client.delete("auth/token")
        except ApiError as exc:
            # A portal older than that endpoint: revoke by the id saved at login.
            if exc.status != 405 or not stored.get("token_id"):
                raise
            client.delete(f"auth/tokens/{stored['token_id']}")
    except ApiError as exc:
        if not quiet and exc.exit_code not in (EXIT_AUTH, EXIT_NOT_FOUND):
            print(f"warning: the token was not revoked: {exc.message}", file=sys.stderr)
        return False
    return True


def cmd_logout(ctx: Context, args: argparse.Namespace) -> int:
    stored = dict(ctx.settings.stored)
    if not stored.get("token"):
        print("Not logged in.")
        return EXIT_OK
    revoked = _revoke_saved_token(stored, quiet=False)
    for key in ("token", "token_id", "expiry", "username"):
        stored.pop(key, None)
    config_save(ctx.settings.path, stored)
    print("Logged out" + (" (token revoked)." if revoked else "."))
    if ctx.env.get("SLUICE_TOKEN"):
        print(
            "note: SLUICE_TOKEN is still set; it is not the saved token and still works",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_whoami(ctx: Context, args: argparse.Namespace) -> int:
    tokens = ctx.client.get("auth/tokens", page_size=1)
    rows = tokens.get("results", [])
    user = rows[0]["user"] if rows else None
    ctx.emit({"url": ctx.settings.url, "user": user}, lambda: f"{user} at {ctx.settings.url}")
    return EXIT_OK


# --- submit -----------------------------------------------------------------------------------

# What a spec file may hold: the API's fields (POST /api/v1/jobs) and a few friendlier names.
# The server declares the fields (scheduling/jobspec.py); this package is installed without
# it, and tests/scheduling/test_jobspec_declared_once.py checks that the two agree.
SPEC_FIELDS = frozenset(
    {
        "project",
        "queue",
        "name",
        "workload_type",
        "gpu_model",
        "gpus_per_node",
        "nodes",
        "min_gpu_memory_mb",
        "cpus",
        "memory_mb",
        "max_runtime_seconds",
        "priority_class",
        "command",
        "shell",
        "env",
        "working_dir",
        "checkpoint_dir",
        "image",
        "image_pull_policy",
        "image_pull_secret",
        "labels",
        "dataset",
        "dataset_version",
        "code_ref",
        "parameters",
        "seed",
        "array",
        "serve",
    }
)
SPEC_ALIASES = {
    "gpus": "gpus_per_node",
    "runtime": "max_runtime_seconds",
    "gpu_models": "gpu_model",
}
WORKLOAD_TYPES = (
    "training",
    "fine_tuning",
    "evaluation",
    "inference",
    "batch_inference",
    "interactive",
)
IMAGE_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MAX_INT32 = 2**31 - 1


@dataclass(frozen=True)
class SpecFlag:
    """A flag of ``sluice submit`` that sets one field of the spec. ``bounds`` and
    ``default`` are the server's (an absent flag leaves the field to the spec file, else to
    the server's default); the help shows them. ``many``: the flag repeats, and this makes
    the field's value of all its values."""

    field: str
    names: tuple[str, ...]
    help: str = ""
    type: Callable[[str], Any] | None = None
    bounds: tuple[int, int] | None = None
    default: Any = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    many: Callable[[list[str]], Any] | None = None
    switch: bool = False

    def help_text(self) -> str:
        said = [f"{self.bounds[0]} to {self.bounds[1]}"] if self.bounds else []
        said += [] if self.default is None else [f"default {self.default}"]
        return " ".join(filter(None, [self.help, f"({'; '.join(said)})" if said else ""]))

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.switch:
            parser.add_argument(*self.names, dest=self.field, action="store_true", help=self.help)
            return
        parser.add_argument(
            *self.names,
            dest=self.field,
            type=self.type,
            choices=self.choices,
            metavar=self.metavar,
            action="append" if self.many else "store",
            help=self.help_text() or None,
        )


SUBMIT_FLAGS: tuple[SpecFlag, ...] = (
    SpecFlag("queue", ("--queue", "-q"), "queue id, NAME or TENANT/NAME"),
    SpecFlag(
        "project",
        ("--project", "-p"),
        "project id or slug (default: the queue's, the tenant's only one, or that of your "
        "latest job in the queue)",
    ),
    SpecFlag("name", ("--name", "-n"), metavar="NAME"),
    SpecFlag("gpus_per_node", ("--gpus", "-g"), "GPUs per node", int, (0, 64), 1, metavar="N"),
    SpecFlag("nodes", ("--nodes", "-N"), "nodes, all at once", int, (1, 256), 1, metavar="N"),
    SpecFlag(
        "gpu_model",
        ("--gpu-model",),
        "GPU model(s) accepted, e.g. H100-80GB (repeat or comma-separate)",
        metavar="MODEL",
        many=_split_list,
    ),
    SpecFlag("cpus", ("--cpus",), "CPU cores", int, (1, 1024), 1, metavar="N"),
    SpecFlag("memory_mb", ("--memory-mb",), "memory in MB", int, (0, MAX_INT32), 0, metavar="MB"),
    SpecFlag(
        "max_runtime_seconds",
        ("--runtime", "-t"),
        "runtime limit, e.g. 2h30m (default: the workload's)",
        metavar="DURATION",
    ),
    SpecFlag("priority_class", ("--priority-class", "--class"), metavar="CLASS"),
    SpecFlag(
        "workload_type",
        ("--workload-type", "-w"),
        "default: training, or the first type the queue allows",
        choices=WORKLOAD_TYPES,
    ),
    SpecFlag(
        "env",
        ("--env", "-e"),
        metavar="KEY=VALUE",
        many=partial(_key_values, what="--env"),
    ),
    SpecFlag(
        "labels",
        ("--label", "-l"),
        metavar="KEY=VALUE",
        many=partial(_key_values, what="--label"),
    ),
    SpecFlag("working_dir", ("--workdir",), metavar="DIR"),
    SpecFlag(
        "checkpoint_dir",
        ("--checkpoint-dir",),
        "where the job keeps its checkpoints (SLUICE_CHECKPOINT_DIR); a time-sharing queue "
        "stops only jobs that have one",
        metavar="DIR",
    ),
    SpecFlag(
        "image",
        ("--image",),
        "container image, e.g. registry.example.com/team/img:tag (pools that run images)",
        metavar="IMAGE",
    ),
    SpecFlag("image_pull_policy", ("--image-pull-policy",), choices=IMAGE_PULL_POLICIES),
    SpecFlag(
        "image_pull_secret", ("--image-pull-secret",), "registry credential secret", metavar="NAME"
    ),
    SpecFlag("shell", ("--shell",), "run the command as one /bin/sh -c line", switch=True),
    SpecFlag(
        "array",
        ("--array",),
        "submit N copies, each with SLUICE_ARRAY_INDEX 0..N-1",
        int,
        (1, 10_000),
        metavar="N",
    ),
)


def _read_spec_file(name: str) -> list[dict]:
    """A spec (an object), or several (a list, or ``{"jobs": [...]}``: submitted together,
    all or nothing). JSON, or YAML when PyYAML is installed."""
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError as json_error:
        if name.endswith(".json"):
            raise UsageError(f"{name}: not valid JSON: {json_error}") from None
        try:
            import yaml
        except ImportError:
            raise UsageError(f"{name}: not JSON, and PyYAML is not installed for YAML") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{name}: not valid YAML or JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("jobs"), list):
        data = data["jobs"]
    specs = data if isinstance(data, list) else [data]
    if not specs or not all(isinstance(s, dict) for s in specs):
        raise UsageError(f"{name}: expected a job spec (an object) or a list of them")
    for i, spec in enumerate(specs):
        unknown = sorted(set(spec) - SPEC_FIELDS - set(SPEC_ALIASES))
        if unknown:
            where = f"{name}" if len(specs) == 1 else f"{name}: jobs[{i}]"
            raise UsageError(f"{where}: unknown field {', '.join(map(repr, unknown))}")
    return specs


def _spec_from_flags(args: argparse.Namespace, command: list[str]) -> dict:
    spec: dict[str, Any] = {}
    for flag in SUBMIT_FLAGS:
        value = getattr(args, flag.field)
        if value is None or value is False:
            continue
        spec[flag.field] = flag.many(value) if flag.many else value
    if command:
        spec["command"] = " ".join(command) if args.shell else command
    return spec


def _job_body(ctx: Context, spec: dict) -> dict:
    """A spec (file and flags merged) as the API's submit body, names resolved to ids."""
    body = {SPEC_ALIASES.get(k, k): v for k, v in spec.items()}
    runtime = body.get("max_runtime_seconds")
    if isinstance(runtime, str):
        try:
            body["max_runtime_seconds"] = parse_duration(runtime)
        except ValueError as exc:
            raise UsageError(f"runtime: {exc}") from None
    if body.get("queue") in (None, ""):
        raise UsageError("give the queue: --queue NAME (see `sluice queues`)")
    command = body.get("command")
    if command in (None, "", []):
        raise UsageError("give the command after --, e.g. sluice submit ... -- python train.py")
    if isinstance(command, str) and not body.get("shell"):
        body["command"] = shlex.split(command)
    project = body.get("project")
    needs_queue = not (
        str(body["queue"]).isdigit()
        and project is not None
        and str(project).isdigit()
        and body.get("workload_type")
    )
    if needs_queue:
        queue = _resolve(ctx, "queue", body["queue"])
        body["queue"] = queue["id"]
        if project in (None, ""):
            body["project"] = _default_project(ctx, queue)
        if not body.get("workload_type"):
            allowed = queue.get("allowed_workload_types") or []
            body["workload_type"] = (
                "training" if not allowed or "training" in allowed else allowed[0]
            )
        if not str(body["project"]).isdigit():
            ref = body["project"]
            body["project"] = _resolve(ctx, "project", ref, tenant=queue["tenant"])["id"]
    body["queue"], body["project"] = int(body["queue"]), int(body["project"])
    return body


def _default_project(ctx: Context, queue: dict) -> int:
    """The queue's own project, else the tenant's only active project, else the project of
    your latest job in this queue (or in its tenant); else a usage error naming the choices."""
    if queue.get("project"):
        return int(queue["project"])
    projects = list(ctx.client.paginate("projects", tenant__slug=queue["tenant"], active=True))
    if len(projects) == 1:
        return projects[0]["id"]
    active = {p["id"]: p["slug"] for p in projects}
    where = f"{queue['tenant']}/{queue['name']}"
    for params in ({"queue": queue["id"]}, {"tenant": queue["tenant"]}):
        for job in ctx.client.paginate(
            "jobs", limit=20, user=_username(ctx), ordering="-id", **params
        ):
            if job.get("project_id") in active:
                slug = active[job["project_id"]]
                scope = where if "queue" in params else f"tenant {queue['tenant']}"
                print(
                    f"note: project {slug}, as your latest job in {scope} (--project to choose)",
                    file=sys.stderr,
                )
                return job["project_id"]
    names = ", ".join(sorted(active.values())) or "none"
    raise UsageError(f"give the project: --project NAME (projects of {queue['tenant']}: {names})")


def cmd_submit(ctx: Context, args: argparse.Namespace) -> int:
    specs = _read_spec_file(args.file) if args.file else [{}]
    flags = _spec_from_flags(args, args.command)
    bodies = [_job_body(ctx, {**spec, **flags}) for spec in specs]
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    if len(bodies) > 1:
        data = ctx.client.request("POST", "jobs/bulk", body={"jobs": bodies}, headers=headers)
    else:
        data = ctx.client.request("POST", "jobs", body=bodies[0], headers=headers)
    ids = data.get("ids") or [data["id"]]
    if args.quiet and not ctx.json:
        print("\n".join(str(i) for i in ids))
        return EXIT_OK

    def human() -> str:
        if "ids" not in data:
            line = (
                f"Submitted job {data['id']} ({data['state']}) to {data['tenant']}/{data['queue']}"
            )
            extra = _job_info(data)
            return line + (f": {extra}" if extra and extra != "-" else "")
        what = f"array {data['array_id']} of" if data.get("array_id") else "bulk of"
        return f"Submitted {what} {data['count']} jobs: {_id_ranges(ids)}"

    ctx.emit(data, human)
    return EXIT_OK


def _id_ranges(ids: list[int]) -> str:
    ids = sorted(ids)
    parts, start = [], ids[0]
    for prev, cur in zip(ids, [*ids[1:], None], strict=True):
        if cur != prev + 1 if cur is not None else True:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(parts)


# --- jobs: ls, show, logs, actions ------------------------------------------------------------


def _gpus(job: dict) -> str:
    total = (job.get("gpus_per_node") or 0) * (job.get("nodes") or 1)
    models = job.get("gpu_model") or []
    text = f"{total}×{models[0]}" if models else str(total)
    return text + ("+" if len(models) > 1 else "")


def _job_info(job: dict) -> str:
    """One line of why a job waits or where it runs or how it ended."""
    state = job.get("state")
    if state == "PENDING":
        parts = []
        if job.get("queue_position"):
            parts.append(f"#{job['queue_position']}")
        reason = job.get("pending_reason") or {}
        if reason.get("code"):
            parts.append(reason["code"])
        if job.get("estimated_start"):
            parts.append(f"start {fmt_ago(job['estimated_start'])}")
        return " ".join(parts) or "waiting for the next dispatch"
    if state == "HELD":
        return "held"
    if state in ACTIVE_STATES:
        nodes = sorted({a["node"] for a in job.get("allocations") or []})
        since = job.get("started_at") or job.get("admitted_at")
        text = f"on {','.join(nodes)}" if nodes else ""
        if since:
            text += f" for {fmt_ago(since).replace(' ago', '')}"
        return text.strip()
    parts = []
    if job.get("exit_code") is not None:
        parts.append(f"exit {job['exit_code']}")
    if job.get("exit_signal"):
        parts.append(_signal_name(job["exit_signal"]) or f"signal {job['exit_signal']}")
    if job.get("stop_reason"):
        parts.append(job["stop_reason"].lower())
    if not parts and job.get("failure_message"):
        parts.append(job["failure_message"])
    return ", ".join(parts)


def cmd_ls(ctx: Context, args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"ordering": "-id"}
    states = _split_list(args.state, upper=True)
    bad = [s for s in states if s not in JOB_STATES]
    if bad:
        raise UsageError(f"unknown state {', '.join(bad)} (states: {', '.join(JOB_STATES)})")
    params["state"] = states
    if args.queue:
        params["queue"] = _resolve(ctx, "queue", args.queue)["id"]
    if args.project:
        params["project"] = _resolve(ctx, "project", args.project, tenant=args.tenant)["id"]
    params["tenant"] = args.tenant
    params["workload_type"] = args.workload_type
    mine = not args.all and not args.user
    params["user"] = args.user or (_username(ctx) if mine else None)
    jobs = list(ctx.client.paginate("jobs", limit=args.limit, **params))

    def human() -> str:
        if not jobs:
            return "No jobs." + ("" if not mine else " (--all: every job you can see)")
        headers = ["id", "name", "state"]
        headers += [] if mine else ["user"]
        headers += ["queue", "gpus", "class", "age", "info"]
        rows = []
        for job in jobs:
            row = [job["id"], clip(job["name"] or "-", 28), job["state"]]
            row += [] if mine else [job["submitted_by"]]
            row += [
                f"{job['tenant']}/{job['queue']}",
                _gpus(job),
                job["priority_class"],
                fmt_ago(job["submitted_at"]).replace(" ago", ""),
                clip(_job_info(job), 60),
            ]
            rows.append(row)
        return table(headers, rows, right=("id", "gpus"))

    ctx.emit(jobs, human)
    return EXIT_OK


def _allocation_lines(job: dict) -> list[str]:
    per_node: dict[str, list[dict]] = {}
    for a in job.get("allocations") or []:
        per_node.setdefault(a["node"], []).append(a)
    lines = []
    for node, allocations in sorted(per_node.items()):
        indexes = ",".join(
            str(a["gpu_index"]) for a in sorted(allocations, key=lambda a: a["gpu_index"])
        )
        models = sorted({a["gpu_model"] for a in allocations})
        borrowed = " borrowed" if any(a.get("borrowed") for a in allocations) else ""
        lines.append(f"{node}: GPU {indexes} ({', '.join(models)}){borrowed}")
    return lines


def _command_text(job: dict) -> str:
    command = job.get("command") or []
    if isinstance(command, str):
        return command + ("  (shell)" if job.get("shell") else "")
    if job.get("shell"):
        return " ".join(command) + "  (shell)"
    return shlex.join(command)


def _show_text(job: dict) -> str:
    rows: list[tuple[str, str]] = []
    add = rows.append
    state = job["state"]
    wait = job.get("wait") or {}
    add(("State", state + (f"  ({job['stop_reason'].lower()})" if job.get("stop_reason") else "")))
    reason = job.get("pending_reason")
    if reason:
        add(("Reason", f"{reason['code']}: {reason['message']}"))
    if job.get("queue_position") or job.get("pool_position"):
        where = []
        if job.get("queue_position"):
            where.append(f"{job['queue_position']} in queue {job['queue']}")
        if job.get("pool_position"):
            where.append(f"{job['pool_position']} in pool {job['pool']}")
        add(("Position", ", ".join(where)))
    if state in ("PENDING", "HELD"):
        add(
            (
                "Est. start",
                fmt_when(job.get("estimated_start"))
                if job.get("estimated_start")
                else "not known yet",
            )
        )
    if wait.get("message"):
        add(("Wait", wait["message"]))
    add(("Tenant", f"{job['tenant']} / project {job['project']}"))
    add(("Queue", f"{job['queue']} (id {job['queue_id']}, pool {job['pool']})"))
    add(("Submitted", f"{fmt_when(job['submitted_at'])} by {job['submitted_by']}"))
    cls = job["priority_class"]
    if job.get("base_priority_class") and job["base_priority_class"] != cls:
        cls += f" (raised from {job['base_priority_class']})"
    add(("Class", cls))
    add(("Workload", job["workload_type"]))
    models = ", ".join(job.get("gpu_model") or []) or "any model"
    add(
        (
            "Resources",
            f"{job['nodes']} node × {job['gpus_per_node']} GPU ({models}), {job['cpus']} CPU"
            + (f", {job['memory_mb']} MB" if job.get("memory_mb") else ""),
        )
    )
    add(("Runtime limit", fmt_duration(job.get("max_runtime_seconds"))))
    expected = job.get("expected_runtime")
    if expected:
        message = expected.get("message") or ""
        if expected.get("seconds"):
            message = f"{fmt_duration(expected['seconds'])}: {message}".rstrip(": ")
        add(("Expected run", message or "-"))
    add(("Command", _command_text(job)))
    allocations = _allocation_lines(job)
    if allocations:
        add(("Allocations", allocations[0]))
        rows.extend(("", line) for line in allocations[1:])
    for label, key in (
        ("Admitted", "admitted_at"),
        ("Started", "started_at"),
        ("Finished", "finished_at"),
    ):
        if job.get(key):
            add((label, fmt_when(job[key])))
    if job.get("started_at") and job.get("finished_at"):
        from .output import parse_time

        ran = (parse_time(job["finished_at"]) - parse_time(job["started_at"])).total_seconds()
        add(("Ran", fmt_duration(ran)))
    ending = _ending(job)
    if ending:
        add(("Ended", ending))
    if job.get("failure_message"):
        add(("Failure", job["failure_message"]))
    if job.get("requeue_count"):
        add(
            (
                "Requeued",
                f"{job['requeue_count']} times ({job.get('preemption_count', 0)} preemptions)",
            )
        )
    if job.get("array_id"):
        add(("Array", f"{job['array_id']} index {job.get('array_index')}"))
    if job.get("image"):
        pull = f" (pull {job['image_pull_policy']})" if job.get("image_pull_policy") else ""
        add(("Image", job["image"] + pull))
    width = max(len(label) for label, _ in rows)
    title = f"Job {job['id']}" + (f"  {job['name']}" if job.get("name") else "")
    return "\n".join([title, *(f"  {label:<{width}}  {value}" for label, value in rows)])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return ""


def _ending(job: dict) -> str:
    """How the job's process ended, as far as it is known: ``exit code 3``, ``stopped by
    signal 15 (SIGTERM)``; empty while it runs or when it never started."""
    code, number = job.get("exit_code"), job.get("exit_signal")
    parts = []
    if number:
        name = _signal_name(number)
        parts.append(f"stopped by signal {number}" + (f" ({name})" if name else ""))
    if code is not None:
        parts.append(f"exit code {code}")
    return ", ".join(parts)


def cmd_show(ctx: Context, args: argparse.Namespace) -> int:
    jobs = [ctx.client.get(f"jobs/{_job_id(i)}") for i in args.ids]
    ctx.emit(jobs[0] if len(jobs) == 1 else jobs, lambda: "\n\n".join(_show_text(j) for j in jobs))
    return EXIT_OK


LOG_WINDOW = 65536
_sleep = time.sleep  # between two looks at a followed log (tests replace it)


def cmd_logs(ctx: Context, args: argparse.Namespace) -> int:
    job_id = _job_id(args.id)
    params: dict[str, Any] = {"tail": args.tail}
    if args.attempt is not None:
        params["attempt"] = args.attempt
    data = ctx.client.get(f"jobs/{job_id}/logs", **params)
    if ctx.json and not args.follow:
        ctx.emit(data, lambda: None)
        return EXIT_OK
    if data["truncated"]:
        print(
            f"[sluice: the first {data['size'] - args.tail} bytes are not shown; --tail to see more]",
            file=sys.stderr,
        )
    sys.stdout.write(data["text"])
    sys.stdout.flush()
    if not args.follow:
        return EXIT_OK
    attempt, size = data["attempt"], data["size"]
    pinned = args.attempt is not None
    while True:
        if not data["running"]:
            job = ctx.client.get(f"jobs/{job_id}")
            if job["state"] in FINAL_STATES:
                # One last read: output shipped between the two requests.
                data = ctx.client.get(f"jobs/{job_id}/logs", tail=LOG_WINDOW, attempt=attempt)
                size = _write_new(ctx, job_id, attempt, size, data)
                print(f"[sluice: job {job_id} {job['state']}]", file=sys.stderr)
                return EXIT_OK
        _sleep(args.interval)
        data = ctx.client.get(
            f"jobs/{job_id}/logs", tail=LOG_WINDOW, **({"attempt": attempt} if pinned else {})
        )
        if data["attempt"] != attempt:  # requeued: a new attempt writes a new log
            print(f"[sluice: attempt {data['attempt']}]", file=sys.stderr)
            attempt, size = data["attempt"], 0
        size = _write_new(ctx, job_id, attempt, size, data)


def _write_new(ctx: Context, job_id: int, attempt: int, size: int, data: dict) -> int:
    """Print what the log gained since ``size`` bytes; returns the new size."""
    new = data["size"] - size
    if new <= 0:
        return max(size, data["size"])
    raw = data["text"].encode("utf-8", errors="replace")
    if new > len(raw):  # more arrived than one window: fetch exactly what is missing
        data = ctx.client.get(
            f"jobs/{job_id}/logs", tail=min(new, 10 * 1024 * 1024), attempt=attempt
        )
        raw = data["text"].encode("utf-8", errors="replace")
    chunk = raw[-new:] if new <= len(raw) else raw
    sys.stdout.write(chunk.decode("utf-8", errors="replace"))
    sys.stdout.flush()
    return data["size"]


def _job_action(verb: str, past: str) -> Callable[[Context, argparse.Namespace], int]:
    def run(ctx: Context, args: argparse.Namespace) -> int:
        results, code = [], EXIT_OK
        ids = [_job_id(i) for i in args.ids]
        for job_id in ids:
            try:
                job = ctx.client.post(f"jobs/{job_id}/{verb}", {"reason": args.reason or ""})
            except ApiError as exc:
                message = exc.message.replace("\n", f"\nerror: job {job_id}: ")
                print(f"error: job {job_id}: {message}", file=sys.stderr)
                code = code or exc.exit_code
                continue
            results.append(job)
            if not ctx.json:
                print(f"job {job['id']}: {past} (now {job['state']})")
        if ctx.json:
            print(json.dumps(results[0] if len(ids) == 1 and results else results, indent=2))
        return code

    return run


# --- raises -----------------------------------------------------------------------------------


def _raise_line(r: dict) -> str:
    scope = f"job {r['job']}" if r["scope"] == "job" else f"project {r['project_slug']}"
    text = f"raise {r['id']}: {scope} {r.get('from_class') or '?'} → {r['to_class']}, {r['state']}"
    if r.get("expires_at"):
        text += f", expires {fmt_ago(r['expires_at'])}"
    return text


def cmd_raise_request(ctx: Context, args: argparse.Namespace) -> int:
    if bool(args.job) == bool(args.project):
        raise UsageError("give a job id, or --project NAME for a time window")
    body: dict[str, Any] = {"to_class": args.to, "reason": args.reason, "hours": args.hours}
    if args.job:
        body["job"] = _job_id(args.job)
    else:
        body["project"] = _resolve(ctx, "project", args.project)["id"]
        body["window_start"], body["window_end"] = args.start, args.end
    data = ctx.client.post("priority-raises", body)
    ctx.emit(data, lambda: f"Requested {_raise_line(data)}")
    return EXIT_OK


def _raise_step(verb: str) -> Callable[[Context, argparse.Namespace], int]:
    def run(ctx: Context, args: argparse.Namespace) -> int:
        raise_id = _job_id(args.id, "raise")
        data = ctx.client.post(
            f"priority-raises/{raise_id}/{verb}", {"comment": args.comment or ""}
        )
        ctx.emit(data, lambda: _raise_line(data))
        return EXIT_OK

    return run


def cmd_raise_ls(ctx: Context, args: argparse.Namespace) -> int:
    states = [s.lower() for s in _split_list(args.state)]
    bad = [s for s in states if s not in RAISE_STATES]
    if bad:
        raise UsageError(f"unknown state {', '.join(bad)} (states: {', '.join(RAISE_STATES)})")
    params: dict[str, Any] = {"ordering": "-id", "state": states}
    if args.decidable:
        params["decidable"] = "true"
    rows = list(ctx.client.paginate("priority-raises", limit=args.limit, **params))

    def human() -> str:
        if not rows:
            return "No raises."
        return table(
            ["id", "state", "tenant", "scope", "class", "by", "hours", "expires", "reason"],
            [
                [
                    r["id"],
                    r["state"],
                    r["tenant"],
                    f"job {r['job']}" if r["scope"] == "job" else f"project {r['project_slug']}",
                    f"{r.get('from_class') or '?'}→{r['to_class']}",
                    r["requested_by"],
                    f"{r['hours']:g}" if r.get("hours") is not None else "-",
                    fmt_ago(r["expires_at"]) if r.get("expires_at") else "-",
                    clip(r["reason"], 40),
                ]
                for r in rows
            ],
            right=("id", "hours"),
        )

    ctx.emit(rows, human)
    return EXIT_OK


# --- queues, quota, nodes ---------------------------------------------------------------------


def cmd_queues(ctx: Context, args: argparse.Namespace) -> int:
    rows = list(ctx.client.paginate("queues", tenant__slug=args.tenant))

    def human() -> str:
        if not rows:
            return "No queues."
        return table(
            ["id", "queue", "env", "pool", "state", "workloads", "class", "fifo"],
            [
                [
                    q["id"],
                    f"{q['tenant']}/{q['name']}",
                    q["environment"],
                    q["pool"],
                    q["state"],
                    ",".join(q.get("allowed_workload_types") or []) or "any",
                    q["default_priority_class"]
                    if q["default_priority_class"] == q["max_self_service_class"]
                    else f"{q['default_priority_class']} (up to {q['max_self_service_class']})",
                    "yes" if q.get("strict_fifo") else "no",
                ]
                for q in rows
            ],
            right=("id",),
        )

    ctx.emit(rows, human)
    return EXIT_OK


def cmd_quota(ctx: Context, args: argparse.Namespace) -> int:
    quotas = list(ctx.client.paginate("quotas", tenant__slug=args.tenant))
    # The API has no usage endpoint: add up the GPUs of the running jobs you can see.
    used: dict[tuple, list[int]] = {}
    active = ctx.client.paginate("jobs", state=sorted(ACTIVE_STATES), tenant=args.tenant)
    for job in active:
        for a in job.get("allocations") or []:
            counts = used.setdefault((job["tenant"], job["pool"], a["gpu_model"]), [0, 0])
            counts[1 if a.get("borrowed") else 0] += 1
    specific = {(q["tenant"], q["pool"], q["gpu_model"]) for q in quotas if q["gpu_model"]}
    for q in quotas:
        # A quota without a GPU model covers the models that have no quota of their own.
        counts = [
            n
            for (tenant, pool, model), n in used.items()
            if (tenant, pool) == (q["tenant"], q["pool"])
            and (
                model == q["gpu_model"]
                or (not q["gpu_model"] and (tenant, pool, model) not in specific)
            )
        ]
        q["used_guaranteed_gpus"] = sum(n[0] for n in counts)
        q["used_borrowed_gpus"] = sum(n[1] for n in counts)

    def human() -> str:
        if not quotas:
            return "No quotas."
        return table(
            [
                "tenant",
                "pool",
                "gpu model",
                "used",
                "guaranteed",
                "borrowed",
                "borrow limit",
                "max jobs",
            ],
            [
                [
                    q["tenant"],
                    q["pool"],
                    q["gpu_model"] or "any",
                    q["used_guaranteed_gpus"] + q["used_borrowed_gpus"],
                    q["guaranteed_gpus"],
                    q["used_borrowed_gpus"],
                    q["borrow_limit_gpus"],
                    q.get("max_running_jobs") or "-",
                ]
                for q in quotas
            ],
            right=("used", "guaranteed", "borrowed", "borrow limit", "max jobs"),
        )

    ctx.emit(quotas, human)
    return EXIT_OK


#: The group columns of ``sluice usage``, in the API's names.
USAGE_GROUPS = ("day", "tenant", "project", "user", "workload_type", "pool", "gpu_model")


def cmd_usage(ctx: Context, args: argparse.Namespace) -> int:
    """GPU-hours allocated and used against the guarantee (GET /api/v1/usage)."""
    group_by = [g for part in (args.by or ["tenant"]) for g in part.split(",") if g]
    params = {"start": args.start, "end": args.end, "group_by": group_by, "tenant": args.tenant}
    params.update(pool=args.pool)
    rows: list[dict] = []
    report: dict = {}
    for page in range(1, 1000):
        report = ctx.client.get("usage", page=page, page_size=MAX_PAGE_SIZE, **params)
        rows.extend(report.get("results", []))
        if not report.get("next"):
            break
    report["results"] = rows

    def percent(value) -> str:
        return "-" if value is None else f"{value:.0f}%"

    def line(row: dict, label: list) -> list:
        return [
            *label,
            f"{row['allocated_gpu_hours']:.1f}",
            f"{row['used_gpu_hours']:.1f}",
            row.get("utilization_note") or percent(row.get("utilization_pct")),
            f"{row['guaranteed_gpu_hours']:.0f}",
            percent(row.get("guarantee_allocated_pct")),
        ]

    def human() -> str:
        columns = [g for g in USAGE_GROUPS if g in report.get("group_by", group_by)]
        head = f"{report.get('start')} → {report.get('end')} ({report.get('hours', 0):.0f} h)"
        if not rows:
            return f"{head}\nNo usage."
        figures = ["allocated gpu-h", "used gpu-h", "util", "guaranteed gpu-h", "of guarantee"]
        body = [line(r, [r.get(c) or "-" for c in columns]) for r in rows]
        total = report.get("totals")
        if total:
            body.append(line(total, ["total"] + [""] * (len(columns) - 1)))
        return (
            head
            + "\n"
            + table([c.replace("_", " ") for c in columns] + figures, body, right=figures)
        )

    ctx.emit(report, human)
    return EXIT_OK


def cmd_nodes(ctx: Context, args: argparse.Namespace) -> int:
    nodes = list(ctx.client.paginate("nodes", pool__name=args.pool))
    gpus: dict[str, list[dict]] = {}
    for gpu in ctx.client.paginate("gpus", node__pool__name=args.pool):
        gpus.setdefault(gpu["node"], []).append(gpu)
    for node in nodes:
        node["gpus"] = sorted(gpus.get(node["name"], []), key=lambda g: g["index"])

    def human() -> str:
        if not nodes:
            return "No nodes."
        rows = []
        for n in nodes:
            models: dict[str, int] = {}
            for g in n["gpus"]:
                models[g["model"]] = models.get(g["model"], 0) + 1
            utils = [g["utilization"] for g in n["gpus"] if g.get("utilization") is not None]
            unhealthy = sum(
                1
                for g in n["gpus"]
                if g.get("health") not in (None, "", "HEALTHY", "healthy", "OK", "ok")
            )
            rows.append(
                [
                    n["name"],
                    n["pool"],
                    n["state"],
                    ", ".join(f"{c}×{m}" for m, c in models.items()) or "-",
                    f"{sum(utils) / len(utils):.0f}%" if utils else "-",
                    unhealthy or "-",
                    fmt_ago(n["last_heartbeat"]) if n.get("last_heartbeat") else "never",
                ]
            )
        return table(
            ["node", "pool", "state", "gpus", "util", "unhealthy", "heartbeat"],
            rows,
            right=("util", "unhealthy"),
        )

    ctx.emit(nodes, human)
    return EXIT_OK


# --- the parser -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    # Options every command takes, before or after its name (subparsers must not reset them).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="the portal (default: SLUICE_URL, the config file, http://127.0.0.1:8000)",
    )
    common.add_argument(
        "--timeout", type=float, default=argparse.SUPPRESS, help="seconds per request (default 30)"
    )

    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Submit, watch and manage Sluice jobs through the REST API.",
        epilog="Exit codes: 0 ok, 1 the API refused (4xx), 2 usage error, 3 not found, "
        "4 not logged in or token refused, 5 server or network error. "
        "Environment: SLUICE_URL, SLUICE_TOKEN, SLUICE_CONFIG, SLUICE_USERNAME (login).",
    )
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    parser.add_argument("--json", action="store_true", default=False, help="print the API's JSON")
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    parser.set_defaults(func=None)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, func, help: str, parent=sub) -> argparse.ArgumentParser:
        p = parent.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(func=func)
        return p

    p = command("login", cmd_login, "get a token with your username and password and save it")
    p.add_argument("--username", "-u")
    p.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from stdin (give --username or SLUICE_USERNAME)",
    )
    p.add_argument("--days", type=int, help="token lifetime in days (default: the server's)")
    command("logout", cmd_logout, "revoke the saved token (DELETE /auth/token) and forget it")
    command("whoami", cmd_whoami, "who the token belongs to")

    p = command(
        "submit", cmd_submit, "submit a job: sluice submit --queue Q [flags] -- COMMAND ARGS..."
    )
    p.add_argument(
        "-f",
        "--file",
        help="a job spec (YAML or JSON; a list submits several, all or nothing); flags override it; - reads stdin",
    )
    for flag in SUBMIT_FLAGS:
        flag.add_to(p)
    p.add_argument("--idempotency-key", help="makes a retry safe: the same key submits once")
    p.add_argument("--quiet", action="store_true", help="print only the job id(s)")
    p.add_argument("command", nargs="*", help=argparse.SUPPRESS)

    p = command("ls", cmd_ls, "list jobs (yours by default)")
    p.add_argument("--state", "-s", action="append", help="e.g. PENDING,RUNNING (repeatable)")
    p.add_argument("--queue", "-q")
    p.add_argument("--project", "-p")
    p.add_argument("--tenant")
    p.add_argument("--workload-type", "-w")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--mine", action="store_true", help="your jobs (the default)")
    who.add_argument("--all", "-a", action="store_true", help="every job you can see")
    who.add_argument("--user", "-u", help="this user's jobs")
    p.add_argument("--limit", "-n", type=int, default=50, help="at most N rows (default 50)")

    p = command("show", cmd_show, "a job's state, reason, position, estimate and allocations")
    p.add_argument("ids", nargs="+", metavar="ID")

    p = command("logs", cmd_logs, "a job's output")
    p.add_argument("id", metavar="ID")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    p.add_argument("--tail", type=int, default=LOG_WINDOW, help="the last N bytes (default 65536)")
    p.add_argument("--attempt", type=int, help="an earlier attempt (default: the current one)")
    p.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)

    for verb, past, help in (
        ("cancel", "cancelled", "cancel jobs (a running one is stopped)"),
        ("hold", "held", "keep pending jobs from starting"),
        ("release", "released", "let held jobs start again"),
    ):
        p = command(verb, _job_action(verb, past), help)
        p.add_argument("ids", nargs="+", metavar="ID")
        p.add_argument("--reason", "-r", default="")

    p = command("raise", None, "priority raises: request, approve, reject, ls")
    rsub = p.add_subparsers(title="raise commands", metavar="STEP")
    p.set_defaults(func=None, _help=p)
    r = command(
        "request", cmd_raise_request, "ask for a higher class for a job (or a project window)", rsub
    )
    r.add_argument("job", nargs="?", metavar="JOB_ID")
    r.add_argument("--to", required=True, metavar="CLASS", help="the class asked for")
    r.add_argument("--reason", required=True)
    r.add_argument("--hours", type=float, help="how long (default: the class's maximum)")
    r.add_argument("--project", help="a project (id or slug) instead of one job")
    r.add_argument("--start", help="window start (ISO time), with --project")
    r.add_argument("--end", help="window end (ISO time), with --project")
    for verb, help in (
        ("approve", "grant a raise"),
        ("reject", "refuse a raise"),
        ("revoke", "end a granted raise now"),
        ("cancel", "withdraw your pending request"),
    ):
        r = command(verb, _raise_step(verb), help, rsub)
        r.add_argument("id", metavar="RAISE_ID")
        r.add_argument("--comment", "-m", default="")
    r = command("ls", cmd_raise_ls, "raises you asked for or may decide", rsub)
    r.add_argument("--state", "-s", action="append")
    r.add_argument("--decidable", action="store_true", help="only those waiting for your decision")
    r.add_argument("--limit", "-n", type=int, default=50)

    p = command("queues", cmd_queues, "the queues you can submit to")
    p.add_argument("--tenant")
    p = command("quota", cmd_quota, "quotas per tenant, pool and GPU model, with what is in use")
    p.add_argument("--tenant")
    p = command("nodes", cmd_nodes, "nodes and their GPUs")
    p.add_argument("--pool")
    p = command("usage", cmd_usage, "GPU-hours allocated and used against the guarantee")
    p.add_argument("--start", help="first day, YYYY-MM-DD (default: 29 days before the end)")
    p.add_argument("--end", help="last day, YYYY-MM-DD (default: today)")
    p.add_argument(
        "--by",
        action="append",
        help="group by " + ", ".join(USAGE_GROUPS) + " (repeat or comma-separate; default tenant)",
    )
    p.add_argument("--tenant", action="append", help="only this tenant (slug; repeatable)")
    p.add_argument("--pool", action="append", help="only this pool (repeatable)")
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``sluice submit [flags] -- python train.py --lr 3e-4``: what follows ``--`` is the
    job's command, untouched (argparse would read its ``--lr`` as a flag of submit)."""
    if "submit" in argv and "--" in argv and argv.index("submit") < argv.index("--"):
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    try:
        code = _run(argv, env)
        sys.stdout.flush()  # here, where a reader gone early (`| head`) can be caught
        return code
    except BrokenPipeError:
        # The reader took what it wanted: end quietly, as other Unix tools do. Python would
        # flush stdout once more at exit and complain: point it at /dev/null first.
        _stdout_to_devnull()
        return EXIT_OK


def _stdout_to_devnull() -> None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (captured in tests)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _run(argv: list[str] | None, env: Mapping[str, str] | None) -> int:
    env = os.environ if env is None else env
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, command = _split_command(argv)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.func is None:
        (getattr(args, "_help", None) or parser).print_help(sys.stderr)
        return EXIT_USAGE
    if command:
        args.command = [*(getattr(args, "command", None) or []), *command]
    json_out = bool(args.json)
    try:
        settings = settings_load(env, args.url)
        ctx = Context(settings, Client(settings.url, settings.token, args.timeout), json_out, env)
        return args.func(ctx, args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        if json_out and exc.body is not None:
            print(json.dumps(exc.body, indent=2, ensure_ascii=False))
        for line in exc.message.splitlines() or [""]:
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
