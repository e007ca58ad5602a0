"""`sluice raise` (request, approve, reject, ls) and the cluster views: queues, quota, nodes."""

from scheduling.choices import JobState, RaiseState
from scheduling.models import PriorityRaise
from tests import factories as f


def _pending_job(world):
    return f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)


def test_request_approve_and_list_a_raise(world, sluice, token_of):
    member, root = token_of(world.member), token_of(world.platform_admin)
    job = _pending_job(world)

    asked = sluice(
        "raise", "request", job.pk, "--to", "high", "--reason", "demo tomorrow", "--hours", "4",
        token=member,
    )  # fmt: skip

    assert asked.code == 0, asked.err
    raise_ = PriorityRaise.objects.get()
    assert raise_.job == job and raise_.to_class == world.high
    assert raise_.reason == "demo tomorrow" and raise_.hours == 4
    assert f"Requested raise {raise_.pk}: job {job.pk} normal → high, pending" in asked.out

    waiting = sluice("raise", "ls", "--decidable", "--json", token=root)
    assert [r["id"] for r in waiting.json()] == [raise_.pk]

    approved = sluice("raise", "approve", raise_.pk, "-m", "ok", token=root)
    assert approved.code == 0, approved.err
    raise_.refresh_from_db()
    assert raise_.state == RaiseState.APPROVED and raise_.decided_by == world.platform_admin
    job.refresh_from_db()
    assert job.priority_class == world.high

    listed = sluice("raise", "ls", "--state", "approved", token=member)
    assert listed.out.splitlines()[0].split()[:3] == ["ID", "STATE", "TENANT"]
    assert f"job {job.pk}" in listed.out and "normal→high" in listed.out


def test_reject_and_who_may_not_decide(world, sluice, token_of):
    job = _pending_job(world)
    member = token_of(world.member)
    assert (
        sluice("raise", "request", job.pk, "--to", "high", "--reason", "r", token=member).code == 0
    )
    raise_ = PriorityRaise.objects.get()

    own = sluice("raise", "approve", raise_.pk, token=member)
    assert own.code == 1  # nobody approves their own request
    assert own.err.startswith("error: ")

    rejected = sluice(
        "raise", "reject", raise_.pk, "-m", "not now", token=token_of(world.platform_admin)
    )
    assert rejected.code == 0, rejected.err
    raise_.refresh_from_db()
    assert raise_.state == RaiseState.REJECTED and raise_.comment == "not now"

    assert sluice("raise", "approve", 999999, token=member).code == 3
    assert sluice("raise", "request", "--to", "high", "--reason", "r", token=member).code == 2


def test_queues_quota_and_nodes(world, sluice, token_of):
    member = token_of(world.member)
    f.placed_job(
        gpus=list(world.nodes[0].gpus.order_by("index")[:3]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        state=JobState.RUNNING,
    )

    queues = sluice("queues", token=member)
    assert queues.code == 0, queues.err
    assert "nlp/train" in queues.out and "vision/train" not in queues.out

    quota = sluice("quota", token=member)
    assert quota.code == 0, quota.err
    assert quota.out.splitlines()[0].split() == [
        "TENANT", "POOL", "GPU", "MODEL", "USED", "GUARANTEED", "BORROWED", "BORROW", "LIMIT",
        "MAX", "JOBS",
    ]  # fmt: skip
    row = next(line for line in quota.out.splitlines() if line.startswith("nlp"))
    assert row.split()[:7] == ["nlp", "training", "any", "3", "8", "0", "8"]
    as_json = sluice("quota", "--json", token=member).json()
    assert as_json[0]["used_guaranteed_gpus"] == 3

    nodes = sluice("nodes", token=member)
    assert nodes.code == 0, nodes.err
    model = world.nodes[0].gpus.first().model
    assert any(
        line.startswith("gpu-01") and f"8×{model}" in line for line in nodes.out.splitlines()
    ), nodes.out
    assert len(sluice("nodes", "--json", token=member).json()[0]["gpus"]) == 8


def test_usage_against_the_guarantee(world, sluice, token_of):
    from datetime import date

    from insights.models import UsageDay

    today = date.today()
    for tenant, user, hours in (
        (world.tenant, world.member, 30.0),
        (world.other, world.outsider, 7.0),
    ):
        UsageDay.objects.create(
            day=today,
            tenant=tenant,
            project=world.project if tenant == world.tenant else world.other_project,
            user=user,
            workload_type="training",
            pool=world.pool,
            gpu_model="H100-80GB",
            allocated_gpu_hours=hours,
            used_gpu_hours=hours / 2,
        )
    token = token_of(world.member)
    run = sluice("usage", "--by", "tenant,user", token=token)
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert lines[1].split()[:2] == ["TENANT", "USER"]
    assert any(line.split()[:4] == ["nlp", "nlp-member", "30.0", "15.0"] for line in lines)
    assert "vision" not in run.out  # a member sees their own tenant only
    assert lines[-1].split()[:3] == ["total", "-", "30.0"]
    data = sluice("usage", "--json", token=token).json()
    assert data["group_by"] == ["tenant"] and data["totals"]["allocated_gpu_hours"] == 30.0
    bad = sluice("usage", "--start", "yesterday", token=token)
    assert bad.code == 1 and "start" in bad.err


def test_usage_without_samples_says_so_not_0_percent(world, sluice, token_of):
    from datetime import date

    from insights.models import UsageDay

    UsageDay.objects.create(
        day=date.today(),
        tenant=world.tenant,
        project=world.project,
        user=world.member,
        workload_type="training",
        pool=world.pool,
        gpu_model="H100-80GB",
        allocated_gpu_hours=12.0,
        used_gpu_hours=0.0,
        sampled_gpu_hours=0.0,
    )
    run = sluice("usage", "--by", "user", token=token_of(world.member))
    assert run.code == 0, run.err
    row = next(line for line in run.out.splitlines() if line.startswith("nlp-member"))
    assert row.split()[1:5] == ["12.0", "0.0", "no", "samples"]  # not "0%" nor "-"
