"""Failed sign-in lockout (django-axes): login page, admin login and POST /api/v1/auth/token
share one count per username; the limit locks the account, also against the right
password, until the cool-off has passed; each lockout is audited once."""

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.utils import timezone
from freezegun import freeze_time
from rest_framework.test import APIClient

from accounts.models import ApiToken
from audit.models import AuditEvent
from tests.factories import PASSWORD

ROOT = Path(__file__).resolve().parents[2]
LOCKED = "Too many failed sign-ins for this account; try again in"


@pytest.fixture(autouse=True)
def _axes_on(settings):
    """The lockout itself is under test: axes on, database handler, the shipped defaults."""
    settings.AXES_ENABLED = True
    settings.AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
    assert settings.AXES_FAILURE_LIMIT == settings.SLUICE_LOGIN_FAILURE_LIMIT == 10
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 15 * 60


def _form(client, password, username="nlp-member"):
    return client.post("/login/", {"username": username, "password": password})


def _api(password, username="nlp-member"):
    return APIClient().post(
        "/api/v1/auth/token", {"username": username, "password": password}, format="json"
    )


def _admin(client, password, username="root"):
    return client.post(
        "/admin/login/", {"username": username, "password": password, "next": "/admin/"}
    )


def test_fifty_wrong_passwords_on_the_form_lock_the_account(world, client):
    answers = [_form(client, f"wrong-{n}").status_code for n in range(50)]

    assert answers[:9] == [200] * 9  # the form again, "wrong password"
    assert set(answers[9:]) == {429}  # the tenth failure locks
    right = _form(client, PASSWORD)
    assert right.status_code == 429
    assert "_auth_user_id" not in client.session
    assert LOCKED in right.content.decode()
    assert "try again in 15 minutes" in right.content.decode()
    # The other way in is locked too: the count is by username.
    api = _api(PASSWORD)
    assert api.status_code == 429
    assert not ApiToken.objects.exists()


def test_wrong_password_below_the_limit_says_wrong_password(world, client):
    response = _form(client, "wrong")

    assert response.status_code == 200
    assert LOCKED not in response.content.decode()
    assert response.context["form"].errors


def test_fifty_wrong_passwords_on_the_api_lock_the_account(world, client):
    answers = [_api(f"wrong-{n}").status_code for n in range(50)]

    assert answers[:9] == [400] * 9
    assert set(answers[9:]) == {429}
    right = _api(PASSWORD)
    assert right.status_code == 429
    body = right.json()
    assert body["detail"].startswith(LOCKED)
    assert body["detail"].endswith("15 minutes.")
    assert body["errors"] == {}
    assert not ApiToken.objects.exists()
    page = _form(client, PASSWORD)
    assert page.status_code == 429
    assert "_auth_user_id" not in client.session


def test_form_and_api_failures_add_up(world, client):
    for n in range(5):
        _form(client, f"wrong-{n}")
    for n in range(4):
        assert _api(f"wrong-api-{n}").status_code == 400

    assert _api("wrong-again").status_code == 429
    assert _api(PASSWORD).status_code == 429


def test_admin_login_is_locked_too(world, client):
    answers = [_admin(client, f"wrong-{n}").status_code for n in range(12)]

    assert answers[:9] == [200] * 9
    assert set(answers[9:]) == {429}
    right = _admin(client, PASSWORD)
    assert right.status_code == 429
    assert LOCKED in right.content.decode()
    assert "_auth_user_id" not in client.session


def test_after_the_cool_off_the_right_password_works(world, client):
    start = timezone.now()
    with freeze_time(start) as clock:
        for n in range(10):
            _form(client, f"wrong-{n}")
        clock.tick(timedelta(minutes=14))
        still = _api(PASSWORD)
        assert still.status_code == 429
        assert still.json()["detail"] == f"{LOCKED} 1 minute."

        clock.tick(timedelta(minutes=1, seconds=1))
        api = _api(PASSWORD)
        page = _form(client, PASSWORD)

    assert api.status_code == 200
    assert api.json()["token"]
    assert page.status_code == 302
    assert int(client.session["_auth_user_id"]) == world.member.pk


def test_attempts_while_locked_do_not_extend_the_lockout(world, client):
    start = timezone.now()
    with freeze_time(start) as clock:
        for n in range(10):
            _api(f"wrong-{n}")
        clock.tick(timedelta(minutes=10))
        for n in range(5):
            assert _api(f"wrong-while-locked-{n}").status_code == 429
        clock.tick(timedelta(minutes=5, seconds=1))

        assert _api(PASSWORD).status_code == 200


def test_a_success_clears_the_failures_counted_so_far(world, client):
    for n in range(9):
        _form(client, f"wrong-{n}")
    assert _api(PASSWORD).status_code == 200
    for n in range(9):
        _api(f"wrong-again-{n}")

    assert _api(PASSWORD).status_code == 200


def test_lockout_of_one_account_leaves_others_alone(world, client):
    for n in range(10):
        _api(f"wrong-{n}")

    assert _api(PASSWORD).status_code == 429
    assert _api(PASSWORD, username="nlp-viewer").status_code == 200


def test_the_lockout_is_audited_once_and_failures_are_not(world, client):
    for n in range(50):
        _form(client, f"wrong-{n}")
    _api(PASSWORD)

    events = list(AuditEvent.objects.filter(action="auth.lockout"))
    assert len(events) == 1
    event = events[0]
    assert event.actor is None
    assert event.target_type == "auth.user"
    assert event.target_id == str(world.member.pk)
    assert event.target_label == "nlp-member"
    assert event.after["failures"] == 10
    assert event.after["locked_until"]
    assert event.source_address == "127.0.0.1"
    # Only the lockout: no audit row per failed attempt.
    assert AuditEvent.objects.count() == 1
    attempt = AccessAttempt.objects.get(username="nlp-member")
    assert attempt.failures_since_start == 10


def test_a_second_lockout_after_the_cool_off_is_audited_again(world):
    start = timezone.now()
    with freeze_time(start) as clock:
        for n in range(10):
            _api(f"wrong-{n}")
        clock.tick(timedelta(minutes=16))
        for n in range(10):
            _api(f"wrong-later-{n}")

    assert AuditEvent.objects.filter(action="auth.lockout").count() == 2


def test_unknown_usernames_lock_but_are_not_audited(world):
    for n in range(12):
        _api(f"wrong-{n}", username="nobody")

    assert _api("x", username="nobody").status_code == 429
    assert not AuditEvent.objects.filter(action="auth.lockout").exists()


def test_platform_admin_unlocks_with_axes_reset_username(world, client):
    for n in range(10):
        _api(f"wrong-{n}")
    assert _api(PASSWORD).status_code == 429

    call_command("axes_reset_username", "nlp-member")

    assert _api(PASSWORD).status_code == 200
    assert _form(client, PASSWORD).status_code == 302


def test_limit_and_cool_off_come_from_the_environment(tmp_path):
    show = (
        "import portal.settings as s; "
        "print(s.AXES_FAILURE_LIMIT, int(s.AXES_COOLOFF_TIME.total_seconds()), "
        "s.SLUICE_API_TOKEN_DAYS, s.SLUICE_API_TOKEN_MAX_DAYS)"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "SLUICE_VAR_DIR": str(tmp_path / "var"),
        "DEBUG": "1",
        "SLUICE_LOGIN_FAILURE_LIMIT": "5",
        "SLUICE_LOGIN_COOLOFF_MINUTES": "30",
        "SLUICE_API_TOKEN_DAYS": "7",
        "SLUICE_API_TOKEN_MAX_DAYS": "14",
    }
    result = subprocess.run(
        [sys.executable, "-c", show],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["5", "1800", "7", "14"]


def test_a_smaller_limit_locks_sooner(world, settings):
    settings.AXES_FAILURE_LIMIT = 3
    for n in range(2):
        assert _api(f"wrong-{n}").status_code == 400

    assert _api("wrong-2").status_code == 429
    assert _api(PASSWORD).status_code == 429
