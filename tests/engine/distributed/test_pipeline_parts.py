"""The parts of the real pipeline that need no second process: stage timing counted as the simulator counts
it, and the store mailboxes (posted, polled, taken once, and a wait that a dead worker stops)."""
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from stallfree.engine.distributed.mailbox import Mailbox
from stallfree.engine.distributed.stage_link import StageTimer
from stallfree.engine.distributed.workers import WorkerDied
from stallfree.engine.simulator.pipeline import Pipeline


def test_stage_idle_and_hand_off_are_counted_as_the_simulator_counts_them():
    """The same two-stage schedule, timed by the simulator's Pipeline and by one StageTimer per stage, each
    later stage told when the stage before it sent the micro-batch (when it ended)."""
    pipeline, timers = Pipeline(2), [StageTimer(), StageTimer()]
    period_start = 0.0
    for now, seconds, handoff, idle_until in [(0.0, (1.0, 2.0), 0.25, None), (1.0, (1.0, 2.0), 0.25, None),
                                              (10.0, (0.5, 0.5), 0.5, 9.5)]:
        if idle_until is not None:
            pipeline.idle_until(idle_until)
            period_start = idle_until
        timing = pipeline.submit(now, seconds, 0.0, [0.0, handoff])
        sent = [None, timing.stage_end_s[0]]
        real = [timer.time(start, end, period_start, sent_s) for timer, start, end, sent_s
                in zip(timers, timing.stage_start_s, timing.stage_end_s, sent, strict=True)]
        assert [busy for busy, _, _ in real] == pytest.approx(list(timing.stage_busy_s))
        assert [idle for _, idle, _ in real] == pytest.approx(list(timing.stage_idle_s))
        assert [handoff for _, _, handoff in real] == pytest.approx(list(timing.stage_handoff_s))


@pytest.fixture
def store():
    master = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield master


def test_a_message_is_taken_once_in_order(store):
    driver, worker = Mailbox(store, 0), Mailbox(store, 1)
    driver.post(1, {"seq": 0})
    driver.post(1, None)
    assert worker.has() and not driver.has()
    assert worker.take() == {"seq": 0} and worker.has()
    assert worker.take() is None and not worker.has()


def test_a_worker_waits_for_its_next_message_past_the_store_timeout(store):
    """The rendezvous store times out (here after 1 s); a worker's mailbox waits for good, as an idle server's
    workers must."""
    store.set_timeout(timedelta(seconds=1))
    driver, worker = Mailbox(store, 0), Mailbox(store, 1)
    poster = threading.Timer(1.5, driver.post, (1, "late"))
    poster.start()
    try:
        assert worker.take() == "late"
    finally:
        poster.join()


def test_waiting_for_a_result_stops_when_the_check_raises(store):
    def dead() -> None:
        raise WorkerDied("worker rank 1 (pid 1) killed by SIGKILL")

    with pytest.raises(WorkerDied, match="rank 1"):
        Mailbox(store, 0).wait(dead)
