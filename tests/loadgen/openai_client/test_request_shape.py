"""What a request body carries and what a response tells: ignore_eos only where the target takes it, the
server's own prompt token count, and which failures mean the server went away."""
import json

from stallfree.engine.records import RequestRecord, RequestSpec
from stallfree.loadgen.openai_client.completions import NO_DONE, apply_sse_event, lost_connection, request

SPEC = RequestSpec("r", 0.0, [11, 12, 13], 4)


def test_ignore_eos_is_sent_only_when_asked():
    assert json.loads(request(SPEC, "m")[1])["ignore_eos"] is True
    body = json.loads(request(SPEC, "m", ignore_eos=False)[1])
    assert "ignore_eos" not in body and body["prompt"] == [11, 12, 13] and body["max_tokens"] == 4


def test_the_servers_usage_counts_the_prompt():
    record = RequestRecord.unsent(SPEC, intended_send_time=0.0, is_warmup=False)
    apply_sse_event(json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}}).encode(),
                    1.0, record)
    assert (record.prompt_tokens, record.output_tokens) == (7, 4)


def test_a_refused_dropped_or_cut_connection_is_a_lost_server_an_answer_is_not():
    for error in ("ConnectionRefusedError: [Errno 111] Connect call failed", "ConnectionResetError: reset",
                  "ConnectionError: server closed the connection before responding",
                  "IncompleteReadError: 0 bytes read on a total of 2 expected bytes", NO_DONE):
        assert lost_connection(error), error
    for error in ("HTTP 400: bad prompt", "server error in stream: boom", None, "no complete response within 1 s"):
        assert not lost_connection(error), error


def test_a_disaggregated_servers_kv_transfer_reaches_the_record():
    from stallfree.engine.request import RequestMetrics
    from stallfree.engine.server.generate import server_timings

    colocated = RequestMetrics(arrival_time=1.0, token_times=[1.5])
    assert "kv_transfer_bytes" not in server_timings(colocated, 1, 2.0)
    moved = RequestMetrics(arrival_time=1.0, token_times=[1.5], kv_transfer_bytes=4096, kv_transfer_start=1.2,
                           kv_transfer_end=1.25)
    chunk = {"choices": [{"text": "", "finish_reason": "length"}], "stallfree": server_timings(moved, 1, 2.0)}
    record = RequestRecord("r", "ok", None, False, 3, 1, 0, 0.0, 0.0, None, None)
    apply_sse_event(json.dumps(chunk).encode(), 2.0, record)
    assert (record.kv_transfer_bytes, record.kv_transfer_start, record.kv_transfer_end) == (4096, 1.2, 1.25)
