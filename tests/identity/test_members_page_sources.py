"""The tenant members page tells directory memberships (synced, not editable there) from
local ones (edited there)."""

import re

import pytest

from identity.choices import DirectorySource, GrantedRole, MappingSource
from identity.models import DirectoryGroupRole
from identity.services import directory_sync_user
from tenants.choices import MembershipSource
from tenants.models import Membership


def _row(body: str, username: str) -> str:
    return re.search(rf'<tr data-member="{username}".*?</tr>', body, re.S).group(0)


@pytest.mark.django_db
def test_directory_members_are_marked_and_have_no_edit_forms(world, client):
    DirectoryGroupRole.objects.create(
        source=MappingSource.ANY, group="nlp", tenant=world.tenant, role=GrantedRole.MEMBER
    )
    directory_sync_user(username="dana", groups=["nlp"], source=DirectorySource.OIDC)
    client.force_login(world.tenant_admin)

    body = client.get("/tenants/nlp/").content.decode()

    dana, local = _row(body, "dana"), _row(body, "nlp-member")
    assert 'data-source="directory"' in dana and "member-role" not in dana
    assert "/members/dana/role" not in dana and "/members/dana/remove" not in dana
    assert 'data-source="local"' in local and "/members/nlp-member/remove" in local
    assert 'id="directory-note"' in body


@pytest.mark.django_db
def test_removing_a_directory_member_by_posting_anyway_is_refused(world, client):
    DirectoryGroupRole.objects.create(
        source=MappingSource.ANY, group="nlp", tenant=world.tenant, role=GrantedRole.MEMBER
    )
    directory_sync_user(username="dana", groups=["nlp"], source=DirectorySource.OIDC)
    client.force_login(world.tenant_admin)

    response = client.post("/tenants/nlp/members/dana/remove", follow=True)

    assert response.status_code == 200
    assert any("comes from the directory" in str(m) for m in response.context["messages"])
    assert Membership.objects.filter(
        user__username="dana", source=MembershipSource.DIRECTORY
    ).exists()
