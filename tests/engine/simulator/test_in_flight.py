"""The scheduler's in-flight set: a request scheduled in a step whose result is not applied yet is neither
scheduled again nor preempted; with one step at a time nothing is in flight when a step is scheduled."""
from stallfree.engine.config import SchedulerConfig
from stallfree.engine.kv_cache import KVCacheManager
from stallfree.engine.request import Request, SamplingParams
from stallfree.engine.scheduler import make_scheduler


def scheduler(policy: str = "sarathi", num_blocks: int = 64):
    return make_scheduler(SchedulerConfig(policy=policy, chunk_size=32), KVCacheManager(num_blocks, 16), 1024, set())


def add(s, request_id: str, prompt: int, max_tokens: int = 8) -> Request:
    request = Request(request_id, list(range(prompt)), SamplingParams(max_tokens=max_tokens), 0.0, 1024)
    s.add_request(request)
    return request


def test_a_step_in_flight_keeps_its_requests_out_of_the_next_one():
    s = scheduler()
    add(s, "a", 20)
    add(s, "b", 40)
    first = s.schedule(0.0)
    assert [u.request_id for u in first.units] == ["a", "b"] and s.in_flight == {"a", "b"}
    second = s.schedule(0.0)  # b's prompt is not done, but its chunk is in flight
    assert second.units == []
    add(s, "c", 10)
    assert [u.request_id for u in s.schedule(0.0).units] == ["c"]
    s.update_from_output(first, {"a": 7}, 1.0)
    assert s.in_flight == {"c"}
    assert [(u.request_id, u.is_prefill) for u in s.schedule(1.0).units] == [("a", False), ("b", True)]


def test_with_one_step_at_a_time_nothing_is_in_flight_when_scheduling():
    s = scheduler("vllm")
    add(s, "a", 20)
    for t in range(10):
        out = s.schedule(float(t))
        assert s.in_flight == {u.request_id for u in out.units}
        s.update_from_output(out, {u.request_id: 5 for u in out.units if u.samples}, t + 0.5)
        assert s.in_flight == set()


def test_preemption_spares_requests_in_flight():
    """Blocks run out while the newest running request is in flight: the newest one not in flight (here the
    decode that needs the block itself) is preempted instead; with nothing in flight the newest goes."""
    def run_until_old_needs_a_block(in_flight: set[str]):
        s = scheduler(num_blocks=4)  # 64 slots
        old, _ = add(s, "old", 16, max_tokens=40), add(s, "new", 16, max_tokens=40)
        while True:
            if s.kv.num_free_blocks == 0 and -(-old.num_tokens // 16) > len(s.kv.block_tables["old"]):
                s.in_flight |= in_flight
                return s.schedule(1.0)
            out = s.schedule(1.0)
            s.update_from_output(out, {u.request_id: 1 for u in out.units if u.samples}, 1.0)

    assert run_until_old_needs_a_block(set()).preempted_request_ids == ["new"]
    out = run_until_old_needs_a_block({"new"})
    assert out.preempted_request_ids == ["old"] and out.units == []


def test_an_aborted_request_in_flight_is_skipped_when_its_step_returns():
    s = scheduler()
    request = add(s, "a", 8)
    out = s.schedule(0.0)
    s.finish(request, request.status.__class__.FINISHED_ABORTED, 0.5)
    assert s.in_flight == set()
    assert s.update_from_output(out, {"a": 3}, 1.0) == []
