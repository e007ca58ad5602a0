"""`sluice login` gets a token with a username and password and keeps it 0600."""

import io
import json
import stat
from pathlib import Path

from accounts.models import ApiToken
from audit.models import AuditEvent
from tests.factories import PASSWORD


def test_login_stores_a_working_token_readable_by_its_owner_only(
    world, sluice, cli_env, monkeypatch
):
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    run = sluice("login", "--username", "nlp-member", "--password-stdin")

    assert run.code == 0, run.err
    assert "Logged in" in run.out and "nlp-member" in run.out
    path = Path(cli_env["SLUICE_CONFIG"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    stored = json.loads(path.read_text())
    assert stored["url"] == cli_env["SLUICE_URL"]
    assert stored["username"] == "nlp-member"
    token = ApiToken.objects.get(pk=stored["token_id"])
    assert token.user == world.member
    assert stored["token"].startswith(token.token_key)

    # Later commands use the saved token: no SLUICE_TOKEN given.
    whoami = sluice("whoami")
    assert whoami.code == 0, whoami.err
    assert whoami.out.startswith("nlp-member")


def test_login_asks_for_username_and_password(world, sluice, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt: "nlp-viewer")
    monkeypatch.setattr("getpass.getpass", lambda prompt: PASSWORD)

    run = sluice("login")

    assert run.code == 0, run.err
    assert ApiToken.objects.filter(user=world.viewer).count() == 1


def test_wrong_password_is_an_auth_error_and_saves_nothing(world, sluice, cli_env, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("not-the-password\n"))

    run = sluice("login", "-u", "nlp-member", "--password-stdin")

    assert run.code == 4
    assert "login refused" in run.err
    assert not Path(cli_env["SLUICE_CONFIG"]).exists()
    assert not ApiToken.objects.exists()


def test_logging_in_again_revokes_the_token_it_replaces(world, sluice, monkeypatch):
    for _ in range(2):
        monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
        assert sluice("login", "-u", "nlp-member", "--password-stdin").code == 0

    assert ApiToken.objects.filter(user=world.member).count() == 1


def test_logout_revokes_the_token_and_forgets_it(world, sluice, cli_env, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert sluice("login", "-u", "nlp-member", "--password-stdin").code == 0

    run = sluice("logout")

    assert run.code == 0, run.err
    assert "revoked" in run.out
    assert not ApiToken.objects.exists()
    assert "token" not in json.loads(Path(cli_env["SLUICE_CONFIG"]).read_text())
    assert sluice("ls").code == 4


def test_a_saved_token_is_not_sent_to_another_server(world, sluice, cli_env, token_of):
    path = Path(cli_env["SLUICE_CONFIG"])
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({"url": "http://other.example:8000", "token": token_of(world.member)})
    )

    run = sluice("ls")

    assert run.code == 4
    assert "not logged in" in run.err


def test_password_stdin_without_a_username_is_a_usage_error(world, sluice, cli_env, monkeypatch):
    """`echo PW | sluice login --password-stdin`: stdin holds the password, so it must not
    be read as the username."""
    stdin = io.StringIO(PASSWORD + "\n")
    monkeypatch.setattr("sys.stdin", stdin)
    monkeypatch.setattr("builtins.input", lambda prompt: stdin.readline().strip())

    run = sluice("login", "--password-stdin")

    assert run.code == 2
    assert "--username NAME or SLUICE_USERNAME" in run.err
    assert stdin.tell() == 0, "the password was read"
    assert not ApiToken.objects.exists()
    assert not Path(cli_env["SLUICE_CONFIG"]).exists()


def test_password_stdin_takes_the_username_from_the_environment(world, sluice, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))

    run = sluice("login", "--password-stdin", env={"SLUICE_USERNAME": "nlp-viewer"})

    assert run.code == 0, run.err
    assert ApiToken.objects.get().user == world.viewer


def test_an_empty_stdin_is_a_usage_error_not_a_blank_password(world, sluice, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))

    run = sluice("login", "-u", "nlp-member", "--password-stdin")

    assert run.code == 2
    assert "no password on stdin" in run.err


def test_logout_ends_the_token_itself_without_knowing_its_id(world, sluice, cli_env, api_token):
    """A config that holds only the URL and the token (written by hand, or by a script that
    made the token with POST /api/v1/auth/token): logout still revokes it, through
    DELETE /api/v1/auth/token."""
    token, key = api_token(world.member)
    path = Path(cli_env["SLUICE_CONFIG"])
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"url": cli_env["SLUICE_URL"], "token": key}))

    run = sluice("logout")

    assert run.code == 0, run.err
    assert "token revoked" in run.out
    assert not ApiToken.objects.filter(pk=token.pk).exists()
    event = AuditEvent.objects.get(action="token.revoke")
    assert event.actor == world.member and event.reason == "logout"
    assert "token" not in json.loads(path.read_text())
