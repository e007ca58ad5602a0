"""Shared fixtures: the base users of CONVENTIONS.md and a small cluster ("world")."""

import datetime
from dataclasses import dataclass

import freezegun
import pytest
from rest_framework.test import APIClient

from scheduling.choices import WorkloadType
from scheduling.services import messaging
from tenants.choices import Role
from tests import factories as f

# freeze_time scans every loaded module's attributes for datetime; the kubernetes client's
# package answers attribute reads by importing its pydantic models, which then fail on
# freezegun's FakeDatetime halfway through the freeze and leave it started for the rest of
# the run. Its modules hold no clock worth freezing.
freezegun.configure(extend_ignore_list=["kubernetes"])
_REAL_DATETIME = datetime.datetime


@pytest.fixture(autouse=True)
def _no_frozen_clock_left_behind():
    """A test that leaves freezegun started freezes every test after it: say which one."""
    yield
    assert datetime.datetime is _REAL_DATETIME, "this test left the clock frozen (freezegun)"


@dataclass
class World:
    """Two tenants; in ``tenant``: an admin, a member and a viewer; an outsider in ``other``."""

    platform_admin: object
    tenant: object
    other: object
    tenant_admin: object
    member: object
    viewer: object
    outsider: object
    project: object
    other_project: object
    pool: object
    queue: object
    other_queue: object
    normal: object
    low: object
    high: object
    nodes: list


@pytest.fixture(autouse=True)
def _clear_outbox():
    messaging.OUTBOX.clear()
    yield
    messaging.OUTBOX.clear()


@pytest.fixture
def world(db) -> World:
    tenant = f.TenantFactory(slug="nlp", name="Language")
    other = f.TenantFactory(slug="vision", name="Vision")
    users = {}
    for role in Role.values:
        users[role] = f.UserFactory(username=f"nlp-{role}")
        f.MembershipFactory(user=users[role], tenant=tenant, role=role)
    outsider = f.UserFactory(username="vision-member")
    f.MembershipFactory(user=outsider, tenant=other, role=Role.ADMIN)
    platform_admin = f.UserFactory(username="root", is_staff=True, is_superuser=True)
    pool = f.PoolFactory(name="training")
    normal = f.PriorityClassFactory(name="normal", value=400)
    low = f.PriorityClassFactory(name="low", value=200, preemptible=True)
    high = f.PriorityClassFactory(name="high", value=600, can_preempt=True, requires_approval=True)
    for wt in WorkloadType.values:
        f.policy(wt)
    nodes = []
    for n in range(2):
        node = f.NodeFactory(name=f"gpu-{n + 1:02d}", pool=pool)
        for i in range(8):
            f.GpuFactory(node=node, index=i, uuid=f"GPU-{node.name}-{i}")
        nodes.append(node)
    for t in (tenant, other):
        f.QuotaFactory(tenant=t, pool=pool, guaranteed_gpus=8, borrow_limit_gpus=8)
    project = f.ProjectFactory(tenant=tenant, slug="llm")
    other_project = f.ProjectFactory(tenant=other, slug="detector")
    queue = f.QueueFactory(
        tenant=tenant,
        name="train",
        pool=pool,
        default_priority_class=normal,
        max_self_service_class=normal,
    )
    other_queue = f.QueueFactory(
        tenant=other,
        name="train",
        pool=pool,
        default_priority_class=normal,
        max_self_service_class=normal,
    )
    return World(
        platform_admin=platform_admin,
        tenant=tenant,
        other=other,
        tenant_admin=users[Role.ADMIN],
        member=users[Role.MEMBER],
        viewer=users[Role.VIEWER],
        outsider=outsider,
        project=project,
        other_project=other_project,
        pool=pool,
        queue=queue,
        other_queue=other_queue,
        normal=normal,
        low=low,
        high=high,
        nodes=nodes,
    )


class FreshUserAPIClient(APIClient):
    """Authenticates each request as the user loaded anew, as the server does: nothing cached
    on a user object (roles, permissions) carries over from one request to the next."""

    def request(self, **kwargs):
        user = self.handler._force_user
        if user is not None:
            self.handler._force_user = type(user)._default_manager.get(pk=user.pk)
        return super().request(**kwargs)


@pytest.fixture
def api():
    """An API client factory: ``api(user)`` returns a client authenticated as that user."""

    def make(user=None):
        client = FreshUserAPIClient()
        if user is not None:
            client.force_authenticate(user=user)
        return client

    return make


def reset_dispatch_state() -> None:
    """The dispatch leader keeps the waiting jobs between cycles (pending_cache); a
    rolled-back database reuses ids, so each test (or hypothesis example run in a
    rolled-back savepoint) starts with an empty copy."""
    from django.core.cache import cache

    from scheduling.raise_impact import _PREVIEW_CACHE
    from scheduling.services.dispatch import LEADER_CACHE
    from scheduling.services.enqueue import DISPATCH_REQUESTED_KEY, WAITING_VERSION_KEY
    from scheduling.services.nodes import REPORTS_PROBE_KEY

    LEADER_CACHE.clear()
    _PREVIEW_CACHE.clear()
    # A test that records dispatch requests instead of sending them leaves the merged
    # request's flag set: the next test's requests would merge into a cycle never run.
    cache.delete_many([REPORTS_PROBE_KEY, WAITING_VERSION_KEY, DISPATCH_REQUESTED_KEY])


@pytest.fixture(autouse=True)
def _fresh_dispatch_cache():
    reset_dispatch_state()
    yield
    reset_dispatch_state()


@pytest.fixture
def outbox():
    """Messages sent to node agents during the test, as (node name, message)."""
    return messaging.OUTBOX


@pytest.fixture
def dispatch_requests(monkeypatch):
    """Replaces "request a dispatch cycle" with a recorder, so tests of submit, cancel and
    friends do not run the engine; each on-commit request appends one entry."""
    calls: list[int] = []
    monkeypatch.setattr("scheduling.services.enqueue.request_dispatch", lambda: calls.append(1))
    return calls


@pytest.fixture
def api_token():
    """``api_token(user, days=None, name=...)`` makes an API token through the service and
    returns ``(token row, key)``; only the key's hash is stored."""
    from accounts.services import api_token_create

    def make(user, *, days=None, name="test token"):
        return api_token_create(user=user, name=name, expires_in_days=days)

    return make


@pytest.fixture
def token_client():
    """``token_client(key)``: an API client that sends ``Authorization: Token <key>``."""

    def make(key: str) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return client

    return make


# --- Unix accounts the test run creates (as root) -------------------------------------------


def pytest_configure(config):
    """Run as root, tests create job accounts (``sluice-test-a``, those of agents started
    with ``--create-accounts``): each creation is recorded in a ledger named by
    ``$SLUICE_CREATED_LEDGER``, set here once for the whole run (test workers and the agents
    they start inherit it), and removed when the run ends. An account that existed before
    the run is not recorded, so never removed."""
    import os
    import tempfile

    from scheduling.agent.ledger import LEDGER_ENV

    if os.geteuid() != 0 or hasattr(config, "workerinput") or os.environ.get(LEDGER_ENV):
        return
    folder = tempfile.mkdtemp(prefix="sluice-test-created-")
    os.environ[LEDGER_ENV] = config._sluice_created_ledger = f"{folder}/created.jsonl"


def pytest_unconfigure(config):
    import os
    import shutil
    from pathlib import Path

    from scheduling.agent.ledger import LEDGER_ENV, remove_created

    created = getattr(config, "_sluice_created_ledger", None)
    if created is None:
        return
    os.environ.pop(LEDGER_ENV, None)
    problems = remove_created(Path(created))
    for problem in problems:
        print(f"\ntest accounts: {problem}")
    if not problems:
        shutil.rmtree(Path(created).parent, ignore_errors=True)
