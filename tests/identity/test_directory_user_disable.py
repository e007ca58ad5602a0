"""Leavers: a user disabled in the directory loses sessions and API tokens, audited; their
jobs keep running unless their tenant's policy cancels them."""

from datetime import timedelta

import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from accounts.models import ApiToken
from accounts.services import api_token_create
from audit.models import AuditEvent
from identity.choices import DirectorySource, GrantedRole, MappingSource
from identity.models import DirectoryGroupRole, DirectoryIdentity
from identity.services import directory_sync_user, oidc_stale_sessions_end
from scheduling.choices import JobState
from tests import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture
def leaver():
    nlp = f.TenantFactory(slug="nlp")
    DirectoryGroupRole.objects.create(
        source=MappingSource.ANY, group="nlp", tenant=nlp, role=GrantedRole.MEMBER
    )
    user = directory_sync_user(
        username="bob", groups=["nlp"], source=DirectorySource.LDAP, subject="uid=bob"
    )
    return user, nlp


def _signed_in_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_disabled_in_the_directory_ends_sessions_and_revokes_tokens(leaver):
    user, _ = leaver
    other = f.UserFactory(username="carol")
    _signed_in_client(user)
    other_client = _signed_in_client(other)
    api_token_create(user=user, name="laptop")
    api_token_create(user=other, name="laptop")
    assert Session.objects.count() == 2

    directory_sync_user(
        username="bob", groups=["nlp"], source=DirectorySource.LDAP, subject="uid=bob", active=False
    )

    user.refresh_from_db()
    assert not user.is_active
    assert not DirectoryIdentity.objects.get(user=user).active
    assert not ApiToken.objects.filter(user=user).exists()
    assert ApiToken.objects.filter(user=other).count() == 1
    assert Session.objects.count() == 1  # carol is still signed in
    assert other_client.get("/").status_code == 200
    event = AuditEvent.objects.get(action="identity.user_disabled")
    assert event.after["sessions_ended"] == 1
    assert event.after["tokens_revoked"] == 1
    assert event.after["source"] == "ldap"
    assert AuditEvent.objects.filter(action="token.revoke", actor=None).count() == 1


def test_running_jobs_of_a_leaver_keep_running_by_default(leaver):
    user, nlp = leaver
    queue = f.QueueFactory(tenant=nlp)
    job = f.JobFactory(queue=queue, submitted_by=user, state=JobState.PENDING)
    directory_sync_user(
        username="bob", groups=[], source=DirectorySource.LDAP, subject="uid=bob", active=False
    )
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_the_tenant_policy_cancels_a_leavers_jobs(leaver):
    user, nlp = leaver
    nlp.cancel_jobs_of_leavers = True
    nlp.save()
    queue = f.QueueFactory(tenant=nlp)
    job = f.JobFactory(queue=queue, submitted_by=user, state=JobState.PENDING)
    directory_sync_user(
        username="bob", groups=[], source=DirectorySource.LDAP, subject="uid=bob", active=False
    )
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert AuditEvent.objects.get(action="identity.user_disabled").after["jobs_cancelled"] == 1


def test_enabled_again_in_the_directory_reactivates_but_a_hand_deactivation_stays(leaver):
    user, _ = leaver
    sync = {
        "username": "bob",
        "groups": ["nlp"],
        "source": DirectorySource.LDAP,
        "subject": "uid=bob",
    }
    directory_sync_user(**sync, active=False)
    directory_sync_user(**sync, active=True)
    user.refresh_from_db()
    assert user.is_active
    assert AuditEvent.objects.filter(action="identity.user_reactivated").count() == 1

    user.is_active = False  # deactivated by hand in Sluice
    user.save()
    directory_sync_user(**sync, active=True)
    user.refresh_from_db()
    assert not user.is_active


def test_oidc_users_signed_in_longer_ago_than_the_max_age_are_signed_out():
    stale = directory_sync_user(
        username="old", groups=[], source=DirectorySource.OIDC, sign_in=True
    )
    fresh = directory_sync_user(
        username="new", groups=[], source=DirectorySource.OIDC, sign_in=True
    )
    DirectoryIdentity.objects.filter(user=stale).update(
        last_sign_in_at=timezone.now() - timedelta(hours=13)
    )
    stale_client, fresh_client = _signed_in_client(stale), _signed_in_client(fresh)

    assert oidc_stale_sessions_end(now=timezone.now(), max_age=timedelta(hours=12)) == 1

    assert stale_client.get("/").status_code == 302  # to the login page
    assert fresh_client.get("/").status_code == 200
    assert AuditEvent.objects.filter(action="identity.sessions_expired").count() == 1
