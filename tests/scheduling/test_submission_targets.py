"""A submission's first read (scheduling.selectors.submission_targets): the
project, queue and workload policy in one statement answer what the ORM's scoped reads
answer, for every kind of user, and the instances are those the ORM would have loaded."""

import pytest
from django.contrib.auth import get_user_model
from django.forms.models import model_to_dict

from scheduling.models import Queue, WorkloadPolicy
from scheduling.selectors import queues_visible_to, submission_targets
from tenants.selectors import member_tenant_ids, project_get_visible
from tests import factories as f

pytestmark = pytest.mark.django_db


def fresh(user):
    """The user as a request loads it: nothing cached on the object."""
    return get_user_model().objects.get(pk=user.pk)


def orm_reads(user, project_id, queue_id, workload_type):
    """What the submission read before: the project as visible, the queue as visible to
    submit (member of its tenant, active user and tenant), the policy."""
    user = fresh(user)
    project = project_get_visible(user, project_id)
    if project is None:
        return None, None, None
    queue = queues_visible_to(user).filter(pk=queue_id).first()
    hidden = queue is not None and not (user.is_active and queue.tenant.active)
    if hidden and not user.is_staff:
        queue = None
    policy = WorkloadPolicy.objects.filter(workload_type=workload_type).first()
    return project, queue, policy


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return type(a) is type(b) and model_to_dict(a) == model_to_dict(b) and a.pk == b.pk


USERS = ["platform_admin", "tenant_admin", "member", "viewer", "outsider"]


@pytest.mark.parametrize("who", USERS)
@pytest.mark.parametrize("target", ["own", "other_project", "other_queue", "missing"])
def test_answers_what_the_scoped_orm_reads_answer(world, who, target):
    project, queue = world.project.pk, world.queue.pk
    if target == "other_project":
        project = world.other_project.pk
    elif target == "other_queue":
        queue = world.other_queue.pk
    elif target == "missing":
        queue = 10**6
    user = getattr(world, who)
    expected = orm_reads(user, project, queue, "training")
    got = submission_targets(
        fresh(user), project_id=project, queue_id=queue, workload_type="training"
    )
    assert [same(a, b) for a, b in zip(got, expected, strict=True)] == [True, True, True]


def test_inactive_tenants_and_users_see_nothing_to_submit_to(world):
    world.tenant.active = False
    world.tenant.save()
    got = submission_targets(
        fresh(world.member),
        project_id=world.project.pk,
        queue_id=world.queue.pk,
        workload_type="training",
    )
    assert got == (None, None, None)


def test_a_queue_of_an_inactive_tenant_is_not_found_even_with_a_visible_project(world):
    """A member of both tenants: the project is visible, the other tenant's queue is not
    while that tenant is inactive (the submission then answers 404 for the queue)."""
    f.MembershipFactory(user=world.member, tenant=world.other, role="member")
    world.other.active = False
    world.other.save()
    project, queue, _ = submission_targets(
        fresh(world.member),
        project_id=world.project.pk,
        queue_id=world.other_queue.pk,
        workload_type="training",
    )
    assert project == world.project and queue is None


def test_the_instances_carry_their_relations_and_the_users_roles(world, django_assert_num_queries):
    user = fresh(world.member)
    stored = Queue.objects.select_related("tenant").get(pk=world.queue.pk)
    with django_assert_num_queries(1):
        project, queue, policy = submission_targets(
            user, project_id=world.project.pk, queue_id=world.queue.pk, workload_type="inference"
        )
        # Read without another query: the relations came in the same row.
        assert project.tenant.slug == "nlp"
        assert str(queue) == str(stored)
        assert queue.pool.name == world.pool.name
        assert queue.default_priority_class.name == "normal"
        assert queue.max_self_service_class.name == "normal"
        assert policy.workload_type == "inference"
        assert member_tenant_ids(user) == [world.tenant.pk]
    assert not project._state.adding and project._state.db == "default"
    # JSON, booleans and datetimes converted as the ORM converts them.
    assert queue.allowed_workload_types == stored.allowed_workload_types
    assert project.created_at == world.project.created_at


def test_a_workload_type_without_a_policy_reads_none(world):
    WorkloadPolicy.objects.filter(workload_type="evaluation").delete()
    _, queue, policy = submission_targets(
        fresh(world.member),
        project_id=world.project.pk,
        queue_id=world.queue.pk,
        workload_type="evaluation",
    )
    assert queue is not None and policy is None


def test_an_anonymous_user_reads_nothing(world, django_assert_num_queries):
    from django.contrib.auth.models import AnonymousUser

    with django_assert_num_queries(0):
        got = submission_targets(
            AnonymousUser(),
            project_id=world.project.pk,
            queue_id=world.queue.pk,
            workload_type="training",
        )
    assert got == (None, None, None)


@pytest.mark.parametrize("which", ["project", "queue"])
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_an_id_no_key_can_hold_names_nothing_as_the_orm_answers(world, which, value):
    """Found by the API's schema fuzzing: an id beyond the database's integers was a 500
    (the driver refuses the parameter); the ORM's lookups answer nothing for it."""
    ids = {"project_id": world.project.pk, "queue_id": world.queue.pk, which + "_id": value}
    got = submission_targets(fresh(world.member), workload_type="training", **ids)
    expected = orm_reads(world.member, ids["project_id"], ids["queue_id"], "training")
    assert all(same(a, b) for a, b in zip(got, expected, strict=True)), (got, expected)
    assert got[0 if which == "project" else 1] is None
