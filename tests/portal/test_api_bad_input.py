"""Bad input is a 400 (or 404) naming the field, never a 500, and stores nothing.

The cases a schemathesis run against the API found: ids out of range in filters,
non-numeric ids in paths, lone UTF-16 surrogates and NUL in any text, text too long for its
column, bad page numbers. tests/portal/test_api_schema_fuzz.py generates many more.
"""

import json

import pytest
from django.db import connection

from accounts import robots
from audit.models import AuditEvent
from portal.api.parsers import bad_text_errors
from scheduling.models import Job, JobEvent, Notification
from scheduling.services import limits, notifications
from tests import factories as f
from tests.raise_helpers import ask

pytestmark = pytest.mark.django_db

MESSAGE = "Text must not contain NUL characters or unpaired UTF-16 surrogates."


def raw_json(api, user, method, url, payload):
    """Send ``payload`` as JSON text exactly as json.dumps writes it: a lone surrogate goes
    as the escape ``\\ud800``, as any client's JSON encoder would send it."""
    return getattr(api(user), method)(url, json.dumps(payload), content_type="application/json")


def job_body(world, **overrides) -> dict:
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        **overrides,
    }


def assert_bad_request(response, field: str) -> dict:
    assert response.status_code == 400, response.content
    data = response.json()
    assert field in data["errors"], data
    assert data["detail"].startswith("Invalid input: ")
    return data


# --- numbers and ids in filters -----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/jobs/?project=1e20", "project"),
        ("/api/v1/jobs/?queue=99999999999999999999", "queue"),
        ("/api/v1/jobs/?queue=-2.19e181", "queue"),
        ("/api/v1/jobs/?project=-1", "project"),
        ("/api/v1/jobs/?project=0", "project"),
        ("/api/v1/jobs/?queue=1.5", "queue"),
        ("/api/v1/jobs/?queue=abc", "queue"),
        ("/api/v1/priority-raises/?job=5.6e27", "job"),
        ("/api/v1/priority-raises/?project=99999999999999999999", "project"),
        ("/api/v1/runtime-extensions/?job=-6.8e255", "job"),
        ("/api/v1/runtime-extensions/?job=9223372036854775808", "job"),
    ],
)
def test_ids_out_of_range_in_filters_are_refused(api, world, url, field):
    assert_bad_request(api(world.member).get(url), field)


def test_largest_id_is_a_valid_filter_that_matches_nothing(api, world):
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    response = api(world.member).get("/api/v1/jobs/?queue=9223372036854775807")

    assert response.status_code == 200
    assert response.json()["count"] == 0


# --- ids in paths -------------------------------------------------------------------------


@pytest.fixture
def extension(world):
    running = f.placed_job(
        gpus=list(world.nodes[0].gpus.order_by("index"))[:1],
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )
    f.policy(running.workload_type, extension_cap_seconds=0)
    return limits.runtime_extension_request(
        user=world.member, job=running, seconds=600, reason="one more epoch"
    )


@pytest.mark.parametrize("pk", ["abc", "null,null", "1e3", "99999999999999999999", "0", "-1"])
@pytest.mark.parametrize(
    ("method", "template"),
    [
        ("get", "/api/v1/runtime-extensions/{pk}/"),
        ("post", "/api/v1/runtime-extensions/{pk}/approve/"),
        ("post", "/api/v1/runtime-extensions/{pk}/reject/"),
        ("post", "/api/v1/notifications/{pk}/read/"),
        ("get", "/api/v1/jobs/{pk}/"),
        ("post", "/api/v1/jobs/{pk}/cancel/"),
        ("get", "/api/v1/priority-raises/{pk}/"),
        ("get", "/api/v1/users/{pk}/"),
    ],
)
def test_ids_that_cannot_exist_in_paths_are_not_found(api, world, extension, method, template, pk):
    response = getattr(api(world.platform_admin), method)(template.format(pk=pk), format="json")

    assert response.status_code == 404, response.content
    assert response.json()["detail"]


def test_notification_of_a_real_id_is_still_marked_read(api, world):
    [note] = notifications.notification_send(users=[world.member], kind="job_requeued", message="x")

    response = api(world.member).post(f"/api/v1/notifications/{note.pk}/read/")

    assert response.status_code == 200
    assert Notification.objects.get(pk=note.pk).read_at is not None


# --- lone surrogates and NUL: nothing is stored -------------------------------------------


BAD_TEXTS = ["\ud800", "\udfff", "tr\udc80ain", "a\x00b"]


def _nothing_stored():
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0
    assert not AuditEvent.objects.filter(action__startswith="job.").exists()


@pytest.mark.parametrize("bad", BAD_TEXTS)
@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"parameters": {"a": "{bad}"}}, "parameters.a"),
        ({"parameters": {"nested": [{"deep": "{bad}"}]}}, "parameters.nested[0].deep"),
        ({"labels": {"team": "{bad}"}}, "labels.team"),
        ({"env": {"EPOCHS": "{bad}"}}, "env.EPOCHS"),
        ({"command": ["python", "{bad}"]}, "command[1]"),
        ({"name": "{bad}"}, "name"),
        ({"dataset": "{bad}"}, "dataset"),
        ({"gpu_model": ["{bad}"]}, "gpu_model[0]"),
    ],
)
def test_job_submit_with_bad_text_is_refused_and_stores_nothing(
    api, world, dispatch_requests, overrides, field, bad
):
    payload = json.loads(json.dumps(overrides).replace("{bad}", json.dumps(bad)[1:-1]))

    response = raw_json(api, world.member, "post", "/api/v1/jobs/", job_body(world, **payload))

    data = assert_bad_request(response, field)
    assert data["errors"][field] == [MESSAGE]
    _nothing_stored()
    assert dispatch_requests == []


@pytest.mark.parametrize("bad", BAD_TEXTS)
def test_bad_text_in_a_key_is_refused_at_the_object_holding_it(api, world, bad):
    body = job_body(world, env={bad: "1"}, labels={"ok": "1"})

    response = raw_json(api, world.member, "post", "/api/v1/jobs/", body)

    data = assert_bad_request(response, "env")
    assert "Names must not contain" in data["errors"]["env"][0]
    _nothing_stored()


def test_bulk_submit_with_one_bad_job_stores_none(api, world):
    good = job_body(world)
    bad = job_body(world, parameters={"lr": "\ud800"})

    response = raw_json(api, world.member, "post", "/api/v1/jobs/bulk/", {"jobs": [good, bad]})

    assert_bad_request(response, "jobs[1].parameters.lr")
    _nothing_stored()


def test_surrogate_pairs_and_other_unicode_are_fine(api, world, dispatch_requests):
    body = job_body(world, name="模型 🚀", parameters={"note": "naïve ✓ \U0001f600"})

    response = raw_json(api, world.member, "post", "/api/v1/jobs/", body)

    assert response.status_code == 201, response.content
    assert Job.objects.get().parameters == {"note": "naïve ✓ \U0001f600"}


@pytest.mark.parametrize(
    ("method", "url", "payload", "field"),
    [
        ("post", "/api/v1/projects/", {"tenant": "nlp", "slug": "x", "name": "\ud800"}, "name"),
        ("post", "/api/v1/priority-raises/", {"to_class": "high", "reason": "a\x00"}, "reason"),
        ("patch", "/api/v1/nodes/gpu-01/", {"labels": {"rack": "\udbff"}}, "labels.rack"),
        ("post", "/api/v1/tenants/nlp/members", {"username": "\x00", "role": "member"}, "username"),
        ("put", "/api/v1/tenants/nlp/raise-ceiling", {"ceiling": "hi\ud800gh"}, "ceiling"),
        ("post", "/api/v1/auth/token", {"username": "root\x00", "password": "x"}, "username"),
    ],
)
def test_bad_text_is_refused_by_every_endpoint(api, world, method, url, payload, field):
    before = AuditEvent.objects.count()

    response = raw_json(api, world.platform_admin, method, url, payload)

    assert_bad_request(response, field)
    assert AuditEvent.objects.count() == before


def test_nul_in_form_data_is_refused(api, world):
    response = api(world.platform_admin).post(
        "/api/v1/projects/", {"tenant": "nlp", "slug": "x", "name": "a\x00b"}, format="multipart"
    )

    assert_bad_request(response, "name")


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/jobs/?user=nlp%00member", "user"),
        ("/api/v1/jobs/?tenant=%00", "tenant"),
        ("/api/v1/audit-events/?actor=%00", "actor"),
        ("/api/v1/users/?username=a%00", "username"),
        ("/api/v1/jobs/1/?whatever=%00", "whatever"),
    ],
)
def test_nul_in_query_parameters_is_refused(api, world, url, field):
    assert_bad_request(api(world.platform_admin).get(url), field)


@pytest.mark.parametrize(
    "url",
    ["/api/v1/pools/tr%00aining/", "/api/v1/priority-classes/%00/", "/api/v1/tenants/nl%00p/"],
)
def test_nul_in_a_name_in_the_path_is_not_found(api, world, url):
    assert api(world.platform_admin).get(url).status_code == 404


def test_too_deeply_nested_json_is_refused(api, world):
    deep = {}
    for _ in range(100):
        deep = {"x": deep}
    body = job_body(world, parameters=deep)

    response = raw_json(api, world.member, "post", "/api/v1/jobs/", body)

    assert response.status_code == 400
    assert "Nested more than" in json.dumps(response.json()["errors"])
    _nothing_stored()


def test_json_nested_beyond_the_parser_is_a_parse_error(api, world):
    text = '{"parameters": ' + "[" * 100_000 + "]" * 100_000 + "}"

    response = api(world.member).post("/api/v1/jobs/", text, content_type="application/json")

    assert response.status_code == 400
    _nothing_stored()


# --- text too long for its column ----------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "n" * 121}, "name"),
        ({"working_dir": "/" + "d" * 500}, "working_dir"),
        ({"dataset_version": "v" * 101}, "dataset_version"),
        ({"labels": {"team": "t" * 201}}, "labels.team"),
        ({"gpu_model": ["H" * 41]}, "gpu_model"),
    ],
)
def test_text_too_long_for_its_column_is_refused(api, world, overrides, field):
    response = raw_json(api, world.member, "post", "/api/v1/jobs/", job_body(world, **overrides))

    assert_bad_request(response, field)
    _nothing_stored()


# --- pages ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("page=0", "page"),
        ("page=-3", "page"),
        ("page=abc", "page"),
        ("page=99999999999999999999999", "page"),
        ("page_size=0", "page_size"),
        ("page_size=-700", "page_size"),
        ("page_size=ten", "page_size"),
    ],
)
def test_bad_page_numbers_are_refused(api, world, query, field):
    assert_bad_request(api(world.member).get(f"/api/v1/jobs/?{query}"), field)


def test_pages_past_the_last_are_not_found_and_big_page_sizes_are_capped(api, world):
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    assert api(world.member).get("/api/v1/jobs/?page=2").status_code == 404
    last = api(world.member).get("/api/v1/jobs/?page=last&page_size=7254652")
    assert last.status_code == 200
    assert last.json()["count"] == 1


# --- job logs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field"),
    [("tail=abc", "tail"), ("tail=0", "tail"), ("attempt=-1", "attempt"), ("attempt=x", "attempt")],
)
def test_bad_log_parameters_are_refused_by_name(api, world, query, field):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    assert_bad_request(api(world.member).get(f"/api/v1/jobs/{job.pk}/logs/?{query}"), field)


def test_log_tail_beyond_the_cap_is_capped(api, world):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    response = api(world.member).get(f"/api/v1/jobs/{job.pk}/logs/?tail=99999999999")

    assert response.status_code == 200
    assert response.json()["attempt"] == 0


# --- text stored before the guard ------------------------------------------------------------


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="only SQLite stores a lone surrogate (in JSON)"
)
def test_a_stored_lone_surrogate_no_longer_breaks_the_job_list(api, world):
    """Rows written before the parsers refused surrogates render as JSON escapes."""
    f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        parameters={"a": "\ud800"},
    )

    response = api(world.member).get("/api/v1/jobs/")

    assert response.status_code == 200
    assert b'"\\ud800"' in response.content
    assert json.loads(response.content)["results"][0]["parameters"] == {"a": "\ud800"}


# --- the parser's walk ----------------------------------------------------------------------


def test_bad_text_errors_name_every_place():
    data = {
        "name": "ok",
        "command": ["ok", "x\x00"],
        "parameters": {"a": "\ud800", "b\ud800": 1, "c": [{"d": "\udfff"}]},
    }

    assert bad_text_errors(data) == {
        "command[1]": [MESSAGE],
        "parameters": ["Names must not contain NUL characters or unpaired UTF-16 surrogates."],
        "parameters.a": [MESSAGE],
        "parameters.c[0].d": [MESSAGE],
    }
    assert bad_text_errors(["\x00"]) == {"[0]": [MESSAGE]}
    assert bad_text_errors("\x00") == {"non_field_errors": [MESSAGE]}


def test_a_raise_with_bad_text_in_the_comment_is_refused(api, world):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    raise_ = ask(world, job)

    response = raw_json(
        api,
        world.tenant_admin,
        "post",
        f"/api/v1/priority-raises/{raise_.pk}/approve/",
        {"comment": "ok\ud800"},
    )

    assert_bad_request(response, "comment")
    raise_.refresh_from_db()
    assert raise_.state == "pending"


# --- any text field of any body, far too long ----------------------------------------------

# A valid body for each operation that creates something, so that a too-long field is the
# only thing wrong and the request would reach the database if nothing refused it.
VALID_BODIES = {
    ("post", "/api/v1/users/"): {"username": "newbie", "password": "a-long-enough-passphrase"},
    ("post", "/api/v1/tenants/"): {"slug": "audio", "name": "Audio"},
    ("post", "/api/v1/projects/"): {"tenant": "nlp", "slug": "asr", "name": "ASR"},
    ("post", "/api/v1/pools/"): {"name": "spare", "purpose": "training"},
    ("post", "/api/v1/priority-classes/"): {"name": "urgent", "value": 900},
    ("post", "/api/v1/quotas/"): {"tenant": "nlp", "pool": "training", "gpu_model": "A100-40GB"},
    ("post", "/api/v1/queues/"): {
        "tenant": "nlp",
        "name": "eval",
        "pool": "training",
        "default_priority_class": "normal",
        "max_self_service_class": "normal",
    },
    ("post", "/api/v1/tenants/{tenant_slug}/members"): {
        "username": "vision-member",
        "role": "viewer",
    },
    ("post", "/api/v1/priority-raises/"): {"job": "{job}", "to_class": "high", "reason": "demo"},
    ("post", "/api/v1/jobs/{id}/extensions/"): {"seconds": 600, "reason": "one more epoch"},
    ("post", "/api/v1/jobs/{id}/exempt/"): {"until": None, "reason": "demo"},
    ("put", "/api/v1/tenants/{tenant_slug}/raise-ceiling"): {"ceiling": "high"},
    ("post", "/api/v1/projects/{id}/submitters/"): {"username": "nlp-viewer", "allowed": True},
}
PATH_VALUES = {
    "tenant_slug": "nlp",
    "slug": "nlp",
    "username": "nlp-viewer",
    "workload_type": "training",
    "/pools/{name}": "training",
    "/priority-classes/{name}": "normal",
    "/nodes/{name}": "gpu-01",
}


def _text_fields_of_request_bodies():
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if not body or "auth/" in path:
                continue
            ref = body["schema"].get("$ref", "")
            properties = components.get(ref.rsplit("/", 1)[-1], {}).get("properties", {})
            for name, prop in properties.items():
                prop = prop.get("oneOf", [prop])[0]  # a blank email is a second choice
                if prop.get("type") == "string" and prop.get("format", "email") == "email":
                    yield method, path, name
                if prop.get("type") == "object" and "additionalProperties" in prop:
                    yield method, path, f"{name}.key"


def _fill_path(path: str, world, job) -> str:
    """``path`` naming objects that exist: ``job``, and for raises and runtime extensions
    one of ``job`` made here."""
    for part, value in PATH_VALUES.items():
        if part.startswith("/"):
            path = path.replace(part, part.replace("{name}", value))
        else:
            path = path.replace("{" + part + "}", value)
    from scheduling.models import Quota

    ids = {
        "/jobs/": job.pk,
        "/projects/": world.project.pk,
        "/queues/": world.queue.pk,
        "/quotas/": Quota.objects.filter(tenant=world.tenant).first().pk,
        "/users/": world.member.pk,
    }
    if "/priority-raises/" in path:
        ids = {"/": ask(world, job).pk}
    if "/runtime-extensions/" in path:
        f.policy(job.workload_type, extension_cap_seconds=0)
        ids = {
            "/": limits.runtime_extension_request(
                user=world.member, job=job, seconds=60, reason="r"
            ).pk
        }
    if "/recommendations/" in path:
        from django.utils import timezone

        from insights.models import Recommendation

        now = timezone.now()
        ids = {
            "/": Recommendation.objects.create(
                kind="repeated_failure",
                key="bad-input",
                tenant=world.tenant,
                title="t",
                created_at=now,
                updated_at=now,
            ).pk
        }
    if "/services/" in path:
        from tests.inference.factories import ServiceFactory, serving

        ids = {"/": ServiceFactory(queue=serving(world).queue, project=world.project).pk}
    if "/robots/{name}" in path:
        from accounts.models import RobotAccount

        robot = RobotAccount.objects.filter(tenant=world.tenant, name="ci").first()
        if robot is None:
            robot = robots.robot_create(
                actor=world.platform_admin, tenant=world.tenant, name="ci", role="member"
            )
        path = path.replace("{name}", robot.name)
        if "/tokens/{id}" in path:
            token, _key = robots.robot_token_create(
                actor=world.platform_admin, robot=robot, name="bad-input"
            )
            ids = {"/tokens/": token.pk}
    if "{id}" in path:
        path = path.replace("{id}", str(next(pk for part, pk in ids.items() if part in path)))
    return path


TEXT_FIELDS = list(_text_fields_of_request_bodies())
# Operations that answer before reading their body.
BODY_NOT_READ = {("post", "/api/v1/nodes/")}  # nodes are registered by their agent
BAD_TEXT_CASES = [
    (method, path, field, where)
    for method, path, field in TEXT_FIELDS
    if (method, path) not in BODY_NOT_READ
    for where in (["key", "value"] if field.endswith(".key") else ["text"])
]


def _valid_body(world, method: str, path: str, job) -> dict:
    from scheduling.models import Quota

    Quota.objects.filter(tenant=world.tenant, gpu_model="A100-40GB").delete()
    body = dict(VALID_BODIES.get((method, path), {}))
    body = {k: (job.pk if v == "{job}" else v) for k, v in body.items()}
    if path == "/api/v1/jobs/":
        body = {**job_body(world), **body}
    return body


@pytest.mark.parametrize(("method", "path", "field"), TEXT_FIELDS)
def test_far_too_long_text_in_any_body_field_is_never_a_server_error(
    api, world, method, path, field
):
    """Caught on PostgreSQL, whose varchar columns refuse what does not fit (SQLite stores it)."""
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    body = _valid_body(world, method, path, job)
    long_text = "x" * 10_000
    if field == "email":  # valid but for its length (at most 254 characters)
        long_text = "x" * 64 + "@" + "d" * 63 + "." + "e" * 63 + "." + "f" * 63 + ".com"
    if field.endswith(".key"):
        body[field[: -len(".key")]] = {long_text: "v", "k": long_text}
    else:
        body[field] = long_text

    response = raw_json(api, world.platform_admin, method, _fill_path(path, world, job), body)

    assert response.status_code < 500, response.content[:500]
    if not field.endswith(".key"):  # a long key may be fine (labels, parameters)
        assert response.status_code == 400, response.content[:500]


@pytest.mark.parametrize("bad", ["\ud800", "\x00"], ids=["surrogate", "nul"])
@pytest.mark.parametrize(("method", "path", "field", "where"), BAD_TEXT_CASES)
def test_bad_text_in_any_body_field_is_refused_by_name(api, world, method, path, field, where, bad):
    """Every text field of every request body, and every key and value of its object fields."""
    job = f.placed_job(
        gpus=list(world.nodes[0].gpus.order_by("index"))[:1],
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )
    body = _valid_body(world, method, path, job)
    url = _fill_path(path, world, job)
    before = (Job.objects.count(), AuditEvent.objects.count())
    if field.endswith(".key"):
        name = field[: -len(".key")]
        body[name] = {f"k{bad}": "v"} if where == "key" else {"k": f"v{bad}"}
        expected = name if where == "key" else f"{name}.k"
    else:
        body[field] = f"a{bad}b"
        expected = field

    response = raw_json(api, world.platform_admin, method, url, body)

    assert response.status_code == 400, response.content[:500]
    assert expected in response.json()["errors"], response.content[:500]
    assert (Job.objects.count(), AuditEvent.objects.count()) == before


# --- numbers the columns hold but date arithmetic does not -----------------------------------


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/priority-classes/high/", {"max_grant_hours": 2**31 - 1}, "max_grant_hours"),
        ("/api/v1/workload-policies/training/", {"retention_days": 2**31 - 1}, "retention_days"),
    ],
)
def test_durations_beyond_any_calendar_are_refused(api, world, url, body, field):
    assert_bad_request(api(world.platform_admin).patch(url, body, format="json"), field)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"hours": 1e308}, "hours"),
        (
            {"window_start": "9999-12-31T22:00:00Z", "window_end": "9999-12-31T23:00:00Z"},
            "window_start",
        ),
        (
            {"window_start": "2030-01-01T00:00:00Z", "window_end": "9999-12-31T23:00:00Z"},
            "window_end",
        ),
    ],
)
def test_raises_beyond_any_calendar_are_refused(api, world, extra, field):
    body = {"project": world.project.pk, "to_class": "high", "reason": "demo", **extra}

    assert_bad_request(
        api(world.member).post("/api/v1/priority-raises/", body, format="json"), field
    )
