"""The client cross-check's own bookkeeping (benchmarks/vs_vllm_client.py): the pairing of a request's two
copies, the trace halves, and the start handshake between the two clients. The runs themselves need
vLLM's CPU build and minutes, so they live in benchmarks/results/, not here."""
import threading
import time

import pytest

from benchmarks.lib.vllm_client import ABORTED, wait_for_start, write_subset, write_trace
from benchmarks.vs_vllm_client import pair_figures
from stallfree.engine.records import RequestRecord


def record(send: float, ttft_ms: float, status: str = "ok") -> RequestRecord:
    first = send + ttft_ms / 1e3
    return RequestRecord(request_id="r", status=status, error=None, is_warmup=False, prompt_tokens=8,
                         max_tokens=4, output_tokens=4, intended_send_time=send, send_time=send,
                         first_token_time=first, finish_time=first + 0.1, token_times=[first])


def test_pairs_served_in_one_iteration_or_split_are_told_apart():
    theirs = [record(0.0, 100.0), record(1.0, 150.0), record(2.0, 90.0), record(3.0, 50.0, status="error")]
    ours = [record(0.0, 102.0), record(1.0, 120.0), record(2.0, 130.0), record(3.0, 50.0)]
    figures = pair_figures(theirs, ours)
    assert figures["pairs"] == 3  # the failed copy's pair does not count
    assert figures["same_step_pairs"] == 1
    assert figures["vllm_copy_later_pairs"] == 1 and figures["stallfree_copy_later_pairs"] == 1
    assert figures["same_step_median_ttft_diff_ms"] == pytest.approx(-2.0)


def test_trace_halves_keep_their_lines_and_send_offsets(tmp_path):
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, 6, 2.0, 40, 8, seed=0)
    lines = trace.read_text().splitlines(keepends=True)
    even = write_subset(trace, [0, 2, 4], tmp_path / "even.jsonl").read_text()
    odd = write_subset(trace, [1, 3, 5], tmp_path / "odd.jsonl").read_text()
    assert even == lines[0] + lines[2] + lines[4] and odd == lines[1] + lines[3] + lines[5]


def test_the_second_client_starts_at_the_time_the_first_wrote(tmp_path):
    start_file = tmp_path / "run.start"
    start = time.perf_counter() + 0.3
    threading.Timer(0.1, lambda: start_file.write_text(repr(start))).start()
    wait_for_start(start_file, timeout_s=10)
    assert time.perf_counter() >= start


def test_a_start_file_seen_while_it_is_written_is_read_again(tmp_path):
    start_file = tmp_path / "run.start"
    start_file.write_text("")  # created, not yet written
    start = time.perf_counter() + 0.3
    threading.Timer(0.1, lambda: start_file.write_text(repr(start))).start()
    wait_for_start(start_file, timeout_s=10)
    assert time.perf_counter() >= start


def test_a_failed_first_client_releases_the_second_with_an_error(tmp_path):
    start_file = tmp_path / "run.start"
    start_file.write_text(ABORTED)
    with pytest.raises(RuntimeError, match="failed before its schedule"):
        wait_for_start(start_file, timeout_s=10)
