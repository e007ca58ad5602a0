"""``manage.py simulate`` on the pure-Python engine: a long replay is announced with a rough
time and how to make it faster (`make native`); a short one, or the compiled engine, not."""

import io

import pytest
from django.core.management import call_command

from scheduling.engine import native
from scheduling.management.commands import simulate

DEFAULT_POLICIES = ["fifo", "sluice", "sluice-no-backfill"]
TRACE = """job_id,submit_time,duration,num_gpus,tenant,priority_class
a,0,3600,8,nlp,normal
b,60,3600,8,vision,normal
c,120,600,2,nlp,high
"""


@pytest.fixture
def pure_engine(monkeypatch):
    monkeypatch.setattr(native, "is_compiled", lambda: False)


def test_the_whole_itp_trace_is_estimated_at_its_measured_time():
    # 679 s measured for the whole trace under the default policies, 17 s for FIFO alone.
    estimate = simulate.pure_engine_estimate(69_351, DEFAULT_POLICIES)
    assert estimate == pytest.approx(679, rel=0.01)
    assert simulate.pure_engine_estimate(69_351, ["fifo"]) == pytest.approx(17, rel=0.01)
    # Half the jobs take well under half the time; more policies take longer.
    assert simulate.pure_engine_estimate(34_675, DEFAULT_POLICIES) < estimate / 2
    assert simulate.pure_engine_estimate(69_351, ["sluice-tuned", *DEFAULT_POLICIES]) > estimate


def test_a_long_replay_on_the_pure_engine_says_how_long_and_how_to_go_faster(pure_engine):
    notice = simulate.pure_engine_notice(69_351, DEFAULT_POLICIES)

    assert notice == (
        "The scheduling engine runs as pure Python: this replay (69,351 jobs, 3 policies) "
        "takes roughly 11 min; `make native` compiles the engine (needs a C compiler) and "
        "replays about 2x faster."
    )


def test_no_notice_for_a_short_replay_or_on_the_compiled_engine(pure_engine, monkeypatch):
    assert simulate.pure_engine_notice(500, DEFAULT_POLICIES) is None
    assert simulate.pure_engine_notice(20_000, ["fifo"]) is None

    monkeypatch.setattr(native, "is_compiled", lambda: True)
    assert simulate.pure_engine_notice(69_351, DEFAULT_POLICIES) is None


@pytest.mark.parametrize("compiled", [False, True])
def test_the_command_prints_the_notice_before_the_replay(tmp_path, monkeypatch, compiled):
    monkeypatch.setattr(native, "is_compiled", lambda: compiled)
    monkeypatch.setattr(simulate, "LONG_REPLAY_SECONDS", 0.0)  # this tiny trace counts as long
    trace = tmp_path / "mine.csv"
    trace.write_text(TRACE)
    out = io.StringIO()

    call_command("simulate", trace=str(trace), out=tmp_path / "sim", workers=1, nodes=1, stdout=out)

    lines = out.getvalue().splitlines()
    notices = [n for n, line in enumerate(lines) if "runs as pure Python" in line]
    if compiled:
        assert notices == []
    else:
        assert len(notices) == 1
        assert "(3 jobs, 3 policies)" in lines[notices[0]]
        assert "`make native`" in lines[notices[0]]
        first_replay = next(n for n, line in enumerate(lines) if "replayed in" in line)
        assert lines[0].startswith("Replaying ") and notices[0] < first_replay
