"""Schemathesis against the OpenAPI schema: every operation, as a member and as a platform
admin, with generated valid and invalid input; no 5xx, every status code documented, every
answer as its schema says, and no body holding NUL or a lone surrogate accepted.

The app runs in-process (WSGI) on the test database, seeded with the base users, jobs in
several states, a pending priority raise, runtime extensions and notifications; path
parameters and ids in bodies name those objects part of the time, so that the fuzzing gets
past "not found". Each operation gets MAX_EXAMPLES generated requests per user, and the
admin also schemathesis' coverage phase (boundary values, missing and wrong-typed fields,
unexpected methods): about 10,000 requests, two to three minutes on one core.

Marked ``fuzz``: deselect with ``-m "not fuzz"``. CI runs it twice: in ``make test``
(SQLite) and in the ``pytest -m ""`` run of .ci/run on PostgreSQL, where NUL and lone
surrogates fail differently (the database refuses them instead of storing them).

To count what a run finds instead of failing at the first finding, set
``SLUICE_FUZZ_REPORT=/some/file.jsonl``: each request is appended there as a JSON line
(operation, role, status, failed checks) and no test fails.
"""

import json
import os

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation.meta import TestPhase
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from portal.api.parsers import bad_text_errors
from scheduling.choices import JobState, NotificationKind
from scheduling.models import Notification, PriorityRaise, RuntimeExtension
from scheduling.services import limits, notifications
from tests import factories as f
from tests.raise_helpers import ask

pytestmark = [pytest.mark.fuzz, pytest.mark.django_db]

MAX_EXAMPLES = 30
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
REPORT = os.environ.get("SLUICE_FUZZ_REPORT")

CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {"mode": "all", "max-examples": MAX_EXAMPLES},
        "phases": {"stateful": {"enabled": False}},
    }
)
# The schema /api/schema/ serves (test_api_schema_is_served checks they are the same).
schema = schemathesis.openapi.from_dict(
    SchemaGenerator().get_schema(request=None, public=True), config=CONFIG
)
APP = get_wsgi_application()

# Objects the seed below makes, by the names the schema gives their path parameters and body
# fields; ids are filled in by the fixture (the database picks them).
KNOWN_IDS: list[int] = []
KNOWN_BODY_IDS: dict[str, list[int]] = {}
KNOWN_NAMES = {
    "/pools/": ["training"],
    "/priority-classes/": ["normal", "low", "high"],
    "/nodes/": ["gpu-01", "gpu-02"],
    "/workload-policies/": ["training", "interactive"],
}
KNOWN_VALUES = {
    "slug": ["nlp", "vision"],
    "tenant_slug": ["nlp"],
    "username": ["nlp-member", "nlp-viewer"],
    "workload_type": ["training"],
}
# Body fields that name other objects, and names that exist.
KNOWN_BODY_VALUES = {
    "to_class": ["high", "normal"],
    "tenant": ["nlp"],
    "pool": ["training"],
    "default_priority_class": ["normal"],
    "max_self_service_class": ["normal"],
    "ceiling": ["high"],
    "username": ["nlp-viewer"],
}


def _known_path_values(path: str, name: str) -> list:
    if name in ("id", "pk"):
        return list(KNOWN_IDS)
    if name == "name":
        return next((names for part, names in KNOWN_NAMES.items() if part in path), [])
    return KNOWN_VALUES.get(name, [])


@schema.hook("flatmap_path_parameters")
def name_known_objects(context, path_parameters):
    """Half the time, the path names an object that exists."""
    if not path_parameters:
        return st.just(path_parameters)
    known = {
        name: st.sampled_from(values)
        for name in path_parameters
        if (values := _known_path_values(context.operation.path, name))
    }
    if not known:
        return st.just(path_parameters)
    fixed = {name: st.just(value) for name, value in path_parameters.items()}
    return st.one_of(st.just(path_parameters), st.fixed_dictionaries({**fixed, **known}))


def _with_lone_surrogate(body: dict, key: str, where: str) -> dict:
    """``body`` with a lone surrogate in field ``key``: in its text, or in an object field
    as a value or as a key."""
    value = body[key]
    if not isinstance(value, dict):
        return {**body, key: f"{value}\ud800"}
    if where == "key":
        return {**body, key: {**value, "k\ud800": "v"}}
    return {**body, key: {**value, "x": "\udc00"}}


@schema.hook("flatmap_body")
def refer_to_known_objects(context, body):
    """Part of the time, the ids and names in a body name objects that exist; part of the
    time, a text field (or an object field's entry) holds a lone surrogate, which JSON can
    spell and no database can store."""
    if not isinstance(body, dict):
        return st.just(body)
    choices = [st.just(body)]
    known = {
        key: st.sampled_from(values)
        for key, values in {**KNOWN_BODY_VALUES, **KNOWN_BODY_IDS}.items()
        if key in body and values and not isinstance(body[key], (dict, list))
    }
    if known:
        fixed = {key: st.just(value) for key, value in body.items()}
        choices.append(st.fixed_dictionaries({**fixed, **known}))
    return st.one_of(*choices).flatmap(_maybe_with_lone_surrogate)


def _maybe_with_lone_surrogate(body: dict):
    texts = sorted(key for key, value in body.items() if isinstance(value, (str, dict)))
    if not texts:
        return st.just(body)
    spoiled = st.builds(
        _with_lone_surrogate,
        st.just(body),
        st.sampled_from(texts),
        st.sampled_from(["key", "value"]),
    )
    return st.one_of(st.just(body), spoiled)


@pytest.fixture
def seeded(world):
    """The world of tests/conftest.py, and objects of every kind the API shows."""
    pending = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    gpus = list(world.nodes[0].gpus.order_by("index"))[:2]
    running = f.placed_job(
        gpus=gpus, queue=world.queue, project=world.project, submitted_by=world.member
    )
    f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        state=JobState.SUCCEEDED,
        exit_code=0,
        finished_at=timezone.now(),
    )
    f.JobFactory(queue=world.other_queue, project=world.other_project, submitted_by=world.outsider)
    ask(world, pending)
    f.policy(running.workload_type, extension_cap_seconds=0)
    limits.runtime_extension_request(
        user=world.member, job=running, seconds=600, reason="one more epoch"
    )
    notifications.notification_send(
        users=[world.member, world.platform_admin],
        kind=NotificationKind.values[0],
        message="Seeded.",
        job=pending,
    )
    KNOWN_IDS[:] = sorted(
        {pending.pk, running.pk, world.project.pk, world.queue.pk, world.member.pk}
        | set(PriorityRaise.objects.values_list("pk", flat=True))
        | set(RuntimeExtension.objects.values_list("pk", flat=True))
        | set(Notification.objects.values_list("pk", flat=True))
    )
    KNOWN_BODY_IDS.update(
        project=[world.project.pk], queue=[world.queue.pk], job=[pending.pk, running.pk]
    )
    return world


@pytest.fixture
def tokens(seeded, api_token):
    keys = {
        "member": api_token(seeded.member)[1],
        "admin": api_token(seeded.platform_admin)[1],
    }
    # As Django's own test client does: a request must not close the test's connection.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield keys
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def check_bad_text_refused(case, response) -> None:
    """A body with NUL or a lone surrogate anywhere is refused: PostgreSQL cannot store it,
    SQLite stores what later breaks rendering (portal.api.parsers)."""
    if response.status_code < 300 and bad_text_errors(case.body):
        raise AssertionError(
            f"Accepted text no database can store ({response.status_code}): {case.body!r}"
        )


def _record(case, role, response) -> None:
    failures = []
    try:
        case.validate_response(response, checks=CHECKS)
    except FailureGroup as group:
        failures = [f"{failure.title}: {failure.message[:300]}" for failure in group.exceptions]
    try:
        check_bad_text_refused(case, response)
    except AssertionError as exc:
        failures.append(f"Bad text accepted: {str(exc)[:300]}")
    line = {
        "op": f"{case.method} {case.path}",
        "role": role,
        "status": response.status_code,
        "failures": failures,
        "url": case.formatted_path,
        "query": case.query,
        "body": case.body if isinstance(case.body, (dict, list, str, int, float)) else None,
        "answer": response.text[:300],
    }
    with open(REPORT, "a", encoding="utf-8") as out:
        out.write(json.dumps(line, default=str) + "\n")


@pytest.mark.parametrize("role", ["member", "admin"])
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_answers_as_documented(case, role, tokens):
    if role == "member" and case.meta and case.meta.phase.name == TestPhase.COVERAGE:
        return  # the coverage phase's hundreds of fixed cases: once, as the admin, is enough
    response = case.call(app=APP, headers={"Authorization": f"Token {tokens[role]}"})
    if REPORT:
        _record(case, role, response)
    else:
        case.validate_response(response, checks=CHECKS)
        check_bad_text_refused(case, response)


def test_api_schema_is_served(client):
    """The schema fuzzed above is the one clients get."""
    served = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert served.status_code == 200
    assert sorted(served.json()["paths"]) == sorted(schema.raw_schema["paths"])
