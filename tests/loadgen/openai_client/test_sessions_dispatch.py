"""Sessions on the HTTP dispatcher: a follow-up turn is sent its think time after the turn before it ended, a
failed turn ends its session with rows saying why, and the other sessions go on."""
import pytest

from stallfree.engine.records import NOT_SENT
from stallfree.engine.records.request_spec import RequestSpec
from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from tests.helpers.fakes.fake_sse_server import running_fake_server

TTFT_MS, TBT_MS = 30.0, 2.0


def turn(session: str, k: int, start: float, think: float = 0.1, max_tokens: int = 4, end=None) -> RequestSpec:
    return RequestSpec(f"{session}-{k}", start, [11 + k] * (8 + 4 * k), max_tokens, session_id=session, turn=k,
                       think_time_s=think if k else 0.0, session_end=end)


@pytest.fixture(scope="module")
def url():
    with running_fake_server(ttft_ms=TTFT_MS, tbt_ms=TBT_MS) as address:
        yield address


def test_follow_ups_wait_for_the_turn_before_and_its_think_time(url):
    specs = [turn("a", 0, 0.0), turn("a", 1, 0.0, think=0.2), turn("a", 2, 0.0, think=0.05, end="last_turn"),
             turn("b", 0, 0.05), turn("b", 1, 0.05, think=0.0, end="last_turn")]
    records = run_open_loop_sync(url, specs, model="fake", timeout_s=10)
    assert [r.status for r in records] == ["ok"] * 5
    assert [(r.session_id, r.turn, r.session_end) for r in records] == [
        ("a", 0, None), ("a", 1, None), ("a", 2, "last_turn"), ("b", 0, None), ("b", 1, "last_turn")]
    by_id = {r.request_id: r for r in records}
    for spec in specs:
        if spec.turn:
            before, after = by_id[f"{spec.session_id}-{spec.turn - 1}"], by_id[spec.request_id]
            assert after.intended_send_time == pytest.approx(before.finish_time + spec.think_time_s)
            assert 0 <= after.send_time - after.intended_send_time < 0.05
    # sessions overlap: b's first turn went out while a was between turns
    assert by_id["b-0"].send_time < by_id["a-1"].send_time


def test_a_failed_turn_ends_its_session_and_the_others_go_on(url):
    specs = [turn("slow", 0, 0.0, max_tokens=500), turn("slow", 1, 0.0), turn("slow", 2, 0.0, end="last_turn"),
             turn("fine", 0, 0.01), turn("fine", 1, 0.01, end="last_turn")]
    records = run_open_loop_sync(url, specs, model="fake", timeout_s=0.3)
    assert [r.status for r in records] == ["timeout", "aborted", "aborted", "ok", "ok"]
    for r in records[1:3]:
        assert r.send_time is None and r.error == f"{NOT_SENT}: turn 0 of its session ended timeout"
        assert r.intended_send_time >= records[0].finish_time


def test_a_cap_holds_turns_like_any_request(url):
    specs = [turn(s, k, 0.0, think=0.0, end="last_turn" if k == 1 else None) for s in "abc" for k in range(2)]
    records = run_open_loop_sync(url, specs, model="fake", timeout_s=10, max_in_flight=1)
    assert all(r.status == "ok" for r in records)
    sends = sorted((r.send_time, r.finish_time) for r in records)
    assert all(later[0] >= earlier[1] for earlier, later in zip(sends, sends[1:], strict=False))
