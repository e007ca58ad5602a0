"""Readers of the real traces (read where they lie, never copied) and of the plain CSV."""

import io

import pytest

from scheduling.simulator import Trace, TraceJob
from scheduling.simulator.cli import default_traces_dir
from scheduling.simulator.readers import (
    TraceError,
    itp_cluster_files,
    load_trace,
    parse_csv,
    read_alibaba,
    read_itp,
    write_csv,
)
from scheduling.simulator.scenario import (
    DEFAULT_CLASS_MIX,
    ScenarioOptions,
    build_scenario,
    declared_limit,
    format_class_mix,
    job_shape,
    parse_class_mix,
    size_pool,
)

TRACES = default_traces_dir()
needs_traces = pytest.mark.skipif(
    not (TRACES / "itp-2021").is_dir(), reason="shared traces not found"
)


@needs_traces
def test_itp_one_cluster_by_name_or_number():
    assert [path.name for path in itp_cluster_files(TRACES / "itp-2021", "4")] == ["cluster04.csv"]
    assert len(itp_cluster_files(TRACES / "itp-2021", "all")) == 10
    with pytest.raises(TraceError, match="no cluster"):
        itp_cluster_files(TRACES / "itp-2021", "cluster99")


@needs_traces
def test_itp_rows_become_jobs_of_their_cluster_pool():
    trace = read_itp(TRACES / "itp-2021", "cluster01")

    assert trace.jobs[0] == TraceJob(
        "965d744f-0445-c1a8-12af-97e4c536c66e", 1932025.0, 2429.0, 64, pool="cluster01"
    )
    assert trace.jobs[1].num_gpus == 1 and trace.jobs[1].duration == 1532.0
    assert len(trace.jobs) == 1595  # every row of the file
    assert trace.independent_pools


@needs_traces
def test_itp_all_clusters():
    trace = load_trace("itp-2021", TRACES)

    assert len(trace.jobs) == 69_351
    assert len({job.pool for job in trace.jobs}) == 10


@needs_traces
def test_alibaba_pods_and_nodes():
    trace = read_alibaba(TRACES / "alibaba-pai-2023")

    assert len(trace.nodes) == 1213
    assert sum(node.gpus for node in trace.nodes) == 6212
    assert trace.nodes[0].model == "P100" and trace.nodes[0].gpus == 2
    first = trace.jobs[0]
    assert (first.job_id, first.submit_time, first.duration) == ("openb-pod-0000", 0, 12537496)
    assert (first.num_gpus, first.priority_class) == (1, "normal")  # qos LS
    assert all(job.num_gpus >= 1 for job in trace.jobs)
    assert {job.pool for job in trace.jobs} == {"default"}


@needs_traces
def test_alibaba_fractional_pods_are_rounded_up_or_skipped():
    rounded = read_alibaba(TRACES / "alibaba-pai-2023", fractional="round-up")
    skipped = read_alibaba(TRACES / "alibaba-pai-2023", fractional="skip")

    names = {job.job_id for job in skipped.jobs}
    assert "openb-pod-0001" not in names  # gpu_milli 460
    assert "openb-pod-0001" in {job.job_id for job in rounded.jobs}
    assert len(rounded.jobs) > len(skipped.jobs)


@needs_traces
def test_alibaba_gpuspec33_carries_model_constraints():
    trace = read_alibaba(TRACES / "alibaba-pai-2023", pods="gpuspec33")

    constrained = [job for job in trace.jobs if job.gpu_models]
    assert constrained
    assert {"T4"} <= {model for job in constrained for model in job.gpu_models}


def test_csv_with_only_the_required_columns():
    text = "job_id,submit_time,duration,num_gpus\na,0,100,1\nb,5.5,60,16\n"

    jobs = parse_csv(io.StringIO(text))

    assert jobs == [TraceJob("a", 0.0, 100.0, 1), TraceJob("b", 5.5, 60.0, 16)]


def test_csv_with_every_column_round_trips():
    jobs = [
        TraceJob(
            "7",
            1_700_000_000.0,
            3600.0,
            16,
            gpus_per_node=8,
            tenant="nlp",
            priority_class="high",
            gpu_models=("H100-80GB", "A100-80GB"),
            workload_type="training",
            pool="training",
            runtime_limit=7200.0,
        )
    ]
    buffer = io.StringIO()
    write_csv(jobs, buffer)

    assert parse_csv(io.StringIO(buffer.getvalue())) == jobs


def test_csv_accepts_iso_times():
    jobs = parse_csv(
        io.StringIO("job_id,submit_time,duration,num_gpus\na,2026-01-01T00:00:00+00:00,1,1\n")
    )

    assert jobs[0].submit_time == 1767225600.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("job_id,submit_time,duration\na,0,1\n", "missing column"),
        ("job_id,submit_time,duration,num_gpus\na,0,x,1\n", "csv:2: duration is not a number"),
        ("job_id,submit_time,duration,num_gpus\na,0,10,0\n", "must be positive"),
        ("job_id,submit_time,duration,num_gpus\na,yesterday,10,1\n", "submit_time"),
    ],
)
def test_bad_csv_names_the_row(text, message):
    with pytest.raises(TraceError, match=message):
        parse_csv(io.StringIO(text))


def test_unknown_trace_name():
    with pytest.raises(TraceError, match="no trace"):
        load_trace("nope", TRACES)


@pytest.mark.parametrize(
    ("gpus", "per_node", "node_gpus", "shape"),
    [
        (1, None, 8, (1, 1)),
        (8, None, 8, (8, 1)),
        (64, None, 8, (8, 8)),
        (12, None, 8, (6, 2)),
        (16, 4, 8, (4, 4)),
    ],
)
def test_job_shapes(gpus, per_node, node_gpus, shape):
    assert job_shape(gpus, per_node, node_gpus) == shape


def test_declared_limit_overestimates_and_is_capped():
    assert declared_limit(100, 2.0, 0) == 240  # 200 s, rounded up to whole minutes
    assert declared_limit(10 * 86400, 2.0, 7 * 86400) == 7 * 86400


def test_cluster_size_keeps_the_offered_load_below_one():
    # 10 jobs of 8 GPUs x 1000 s over a span of 1000 s: 80 GPUs busy on average.
    jobs = [TraceJob(str(n), n * 1000 / 9, 1000, 8) for n in range(10)]

    nodes, why = size_pool(jobs, 8, target_load=1.0)

    assert nodes == 11  # 10 nodes would be exactly 100 %
    assert "below 100 %" in why


def test_cluster_size_meets_a_target_load():
    # 80 GPUs busy on average: 85 % needs 94.1 GPUs, so 12 nodes (96 GPUs, 83.3 %).
    jobs = [TraceJob(str(n), n * 1000 / 9, 1000, 8) for n in range(10)]

    nodes, why = size_pool(jobs, 8, target_load=0.85)

    assert nodes == 12
    assert "at or below 85% (83.3%)" in why
    assert size_pool(jobs, 8, target_load=0.8)[0] == 13  # exactly 80 % on 100 GPUs is 12.5
    with pytest.raises(ValueError):
        size_pool(jobs, 8, target_load=0)


def test_scenario_draws_tenants_and_sizes_quotas_by_demand():
    jobs = [TraceJob(str(n), float(n), 100.0, 1) for n in range(200)]
    scenario = build_scenario(Trace("t", jobs), ScenarioOptions(tenants=3, seed=1))

    assert {job.tenant for job in scenario.jobs} == {"t1", "t2", "t3"}
    assert {job.priority_class for job in scenario.jobs} == {"high", "normal", "low"}
    assert sum(quota.guaranteed for quota in scenario.quotas) == scenario.capacity
    assert any("nodes x 8 GPUs" in note for note in scenario.notes)


def test_another_class_mix_draws_the_same_tenants():
    jobs = [TraceJob(str(n), float(n), 100.0, 1) for n in range(300)]
    usual = build_scenario(Trace("t", jobs), ScenarioOptions(tenants=3, seed=2))
    mix = parse_class_mix("high=0.1, normal=0.9")
    other = build_scenario(Trace("t", jobs), ScenarioOptions(tenants=3, seed=2, class_mix=mix))

    assert [job.tenant for job in other.jobs] == [job.tenant for job in usual.jobs]
    assert {job.priority_class for job in other.jobs} == {"high", "normal"}
    assert any(
        "classes: none in the trace; drawn: high 10%, normal 90%" in note for note in other.notes
    )
    # A job drawn "low" under the usual mix is "normal" now; the others keep their class.
    for before, after in zip(usual.jobs, other.jobs, strict=True):
        if before.priority_class != "low":
            assert after.priority_class == before.priority_class


def test_class_mix_reads_names_and_weights():
    assert parse_class_mix(None) == DEFAULT_CLASS_MIX
    assert parse_class_mix("") == DEFAULT_CLASS_MIX
    assert parse_class_mix("normal=1") == (("normal", 1.0),)
    assert parse_class_mix("low=0, high=2") == (("low", 0.0), ("high", 2.0))
    assert parse_class_mix(format_class_mix(DEFAULT_CLASS_MIX)) == DEFAULT_CLASS_MIX


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("normal", "expected NAME=WEIGHT"),
        ("urgent=1", "NAME one of high, normal, low"),
        ("high=x", "'x' is not a number"),
        ("high=-1", "a weight is 0 or more"),
        ("high=nan", "a weight is 0 or more"),
        ("high=inf", "a weight is 0 or more"),
        ("high=1,high=2", "high given twice"),
        ("high=0,low=0", "the weights add up to 0"),
    ],
)
def test_a_bad_class_mix_says_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_class_mix(text)
