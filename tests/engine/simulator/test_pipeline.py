"""Pipeline stages: when each stage runs a micro-batch, and its bubbles, on hand-made schedules."""
import pytest

from stallfree.engine.simulator.pipeline import Pipeline


def test_two_stage_schedule_times_and_bubbles():
    pipe = Pipeline(2)
    pipe.idle_until(0.0)
    a = pipe.submit(0.0, [1.0, 1.0], send_s=0.0)
    assert (a.stage_start_s, a.stage_end_s, a.end_s) == ((0.0, 1.0), (1.0, 2.0), 2.0)
    assert a.stage_idle_s == (0.0, 1.0)  # stage 1 waits for the pipeline to fill
    b = pipe.submit(1.0, [2.0, 2.0], send_s=0.0)  # a longer micro-batch: stage 1 waits on stage 0
    assert (b.stage_start_s, b.stage_end_s, b.stage_idle_s) == ((1.0, 3.0), (3.0, 5.0), (0.0, 1.0))
    c = pipe.submit(3.0, [1.0, 1.0], send_s=0.0)  # a shorter one: stage 1 is still busy, no bubble
    assert (c.stage_start_s, c.stage_end_s, c.stage_idle_s) == ((3.0, 5.0), (4.0, 6.0), (0.0, 0.0))
    assert c.stage_busy_s == (1.0, 1.0)


def test_uniform_micro_batches_leave_fewer_bubbles_than_alternating_ones():
    """The same work (4 s per stage) as uniform 1 s micro-batches or alternating 0.25 s / 1.75 s ones."""
    def bubbles(stage_times: list[float]) -> float:
        pipe, now, idle = Pipeline(2), 0.0, 0.0
        for seconds in stage_times:
            timing = pipe.submit(now, [seconds, seconds], send_s=0.0)
            now = pipe.stage_free_s[0]
            idle += sum(timing.stage_idle_s)
        return idle

    assert bubbles([1.0] * 4) == pytest.approx(1.0)  # the fill only
    assert bubbles([0.25, 1.75] * 2) == pytest.approx(0.25 + 1.5)  # the fill, then stage 1 waits on a long one


def test_send_time_delays_the_next_stage_and_counts_as_its_bubble():
    pipe = Pipeline(3)
    t = pipe.submit(0.0, [1.0, 1.0, 1.0], send_s=0.5)
    assert t.stage_start_s == (0.0, 1.5, 3.0) and t.end_s == 4.0
    assert t.stage_idle_s == (0.0, 1.5, 3.0)


def test_a_hand_off_delays_a_stage_even_when_its_input_is_ready_and_counts_as_its_bubble():
    pipe = Pipeline(2)
    a = pipe.submit(0.0, [1.0, 2.0], send_s=0.0, handoff_s=[0.0, 0.25])
    assert a.stage_start_s == (0.0, 1.25) and a.stage_idle_s == (0.0, 1.25) and a.stage_handoff_s == (0.0, 0.25)
    b = pipe.submit(1.0, [1.0, 1.0], send_s=0.0, handoff_s=[0.0, 0.25])  # stage 1 is free last: its input waits
    assert b.stage_start_s == (1.0, 3.5) and b.stage_idle_s == (0.0, 0.25) and b.end_s == 4.5


def test_time_without_work_is_not_a_bubble():
    pipe = Pipeline(2)
    pipe.submit(0.0, [1.0, 1.0], send_s=0.0)
    pipe.idle_until(10.0)  # the engine had no requests until t = 10
    t = pipe.submit(10.0, [1.0, 1.0], send_s=0.0)
    assert t.stage_idle_s == (0.0, 1.0)


def test_a_pipeline_needs_a_time_per_stage():
    with pytest.raises(ValueError, match="2 stage times for a 3-stage pipeline"):
        Pipeline(3).submit(0.0, [1.0, 1.0], send_s=0.0)
    with pytest.raises(ValueError, match="2 hand-off times for a 3-stage pipeline"):
        Pipeline(3).submit(0.0, [1.0, 1.0, 1.0], send_s=0.0, handoff_s=[0.0, 0.1])
