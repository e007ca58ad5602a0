"""The nodes page's per-pool summary before the GPU rows: totals, allocated, used, idle,
free and down per pool and GPU model, from the GPUs' last samples."""

from __future__ import annotations

import re

import pytest

from scheduling.choices import GpuHealth, NodeState
from scheduling.services.config import NODE_RETIRED_LABEL
from tests import factories as f

pytestmark = pytest.mark.django_db


def summary_row(body: str, row_id: str) -> list[str]:
    found = re.search(rf'<tr id="{row_id}">(.*?)</tr>', body, re.S)
    assert found, f"no summary row {row_id}"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", found.group(1), re.S)
    return [re.sub(r"<[^>]+>", "", c).strip() for c in cells]


def test_summary_counts_per_pool_and_model(world, client):
    gpus = world.nodes[0].gpus.order_by("index")
    busy, idle, unsampled = gpus[0], gpus[1], gpus[2]
    busy.utilization, idle.utilization = 80.0, 2.0
    busy.save()
    idle.save()
    f.placed_job(
        gpus=[busy, idle], queue=world.queue, project=world.project, submitted_by=world.member
    )
    f.placed_job(
        gpus=[unsampled], queue=world.queue, project=world.project, submitted_by=world.member
    )
    unhealthy = gpus[7]
    unhealthy.health = GpuHealth.UNHEALTHY
    unhealthy.save()
    world.nodes[1].state = NodeState.DOWN
    world.nodes[1].save()
    inference = f.PoolFactory(name="serving")
    node = f.NodeFactory(name="srv-01", pool=inference)
    for i in range(4):
        f.GpuFactory(node=node, index=i, uuid=f"GPU-srv-{i}", model="L40S")
    retired = f.NodeFactory(
        name="old-01", pool=inference, state=NodeState.DOWN, labels={NODE_RETIRED_LABEL: "1"}
    )
    f.GpuFactory(node=retired, index=0, uuid="GPU-old-0", model="L40S")
    client.force_login(world.member)

    body = client.get("/nodes/?retired=1").content.decode()

    # pool, model, bar, total, allocated, used, idle, free, down, mean utilization
    training = summary_row(body, "summary-training-H100-80GB")
    assert training[:2] == ["training", "H100-80GB"]
    assert training[3:] == ["16", "3", "1", "2", "4", "9", "27 %"]
    assert summary_row(body, "summary-serving-L40S")[3:] == ["4", "0", "0", "0", "4", "0", "—"]
    assert body.index('id="pool-summary"') < body.index('id="node-gpu-01"')
    assert 'class="used w-6"' in body and 'class="idle w-13"' in body
    assert 'class="free w-25"' in body and 'class="down w-56"' in body


def test_summary_is_in_the_live_fragment(world, client):
    client.force_login(world.viewer)

    body = client.get("/nodes/", HTTP_HX_REQUEST="true").content.decode()

    assert 'id="pool-summary"' in body
    assert summary_row(body, "summary-training-H100-80GB")[3:8] == ["16", "0", "0", "0", "16"]
