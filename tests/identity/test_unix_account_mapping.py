"""``{user}`` in SLUICE_JOB_ACCOUNT is the Unix account the directory gives a user, never
their (typed) user name, when the directory gives one."""

import pytest

from identity.choices import DirectorySource
from identity.services import directory_sync_user
from scheduling.services.dispatch import job_accounts
from tests import factories as f

pytestmark = pytest.mark.django_db


def test_jobs_run_as_the_directorys_unix_account_under_the_user_mapping(settings):
    settings.SLUICE_JOB_ACCOUNT = "{user}"
    directory = directory_sync_user(
        username="alice.smith@example.org",  # not a Unix name; the claim gives one
        groups=[],
        source=DirectorySource.OIDC,
        subject="sub-1",
        unix_account="asmith",
    )
    local = f.UserFactory(username="bob")
    queue = f.QueueFactory()
    mine = f.JobFactory(queue=queue, submitted_by=directory)
    theirs = f.JobFactory(queue=queue, submitted_by=local)

    assert job_accounts([mine, theirs]) == {mine.id: "asmith", theirs.id: "bob"}


def test_a_directory_user_without_a_unix_account_falls_back_to_the_user_name(settings):
    settings.SLUICE_JOB_ACCOUNT = "{user}"
    user = directory_sync_user(username="carol", groups=[], source=DirectorySource.LDAP)
    job = f.JobFactory(queue=f.QueueFactory(), submitted_by=user)
    assert job_accounts([job]) == {job.id: "carol"}
