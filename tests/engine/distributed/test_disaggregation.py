"""parallel.disaggregation=1p1d: prompts prefilled on an instance of their own, their KV sent to the decode
instance over gloo, and the greedy tokens of one process and of HF transformers."""
import os
import signal

import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.config_checks import ConfigError
from stallfree.engine.request import RequestStatus
from tests.helpers.engine import BLOCK, hf_greedy, run_staggered, shared_prefix_prompts

MAX_TOKENS = 5


def make_pd_engine(tiny_path, policy="sarathi", **kwargs):
    knobs = dict(model=str(tiny_path), scheduler=policy, chunk_size=32, dtype="float32", max_num_seqs=4,
                 block_size=BLOCK, max_model_len=256, max_num_batched_tokens=256, enable_prefix_caching=True,
                 disaggregation="1p1d", startup_timeout_s=60)
    return LLMEngine.from_kwargs(**(knobs | kwargs))


@pytest.fixture(scope="module")
def prompts():
    return shared_prefix_prompts()


@pytest.fixture(scope="module")
def pd_engine(tiny_path):
    engine = make_pd_engine(tiny_path)
    yield engine
    engine.shutdown()


def test_1p1d_gives_the_tokens_of_hf(pd_engine, tiny_path, prompts):
    outputs = run_staggered(pd_engine, prompts, MAX_TOKENS, gap=1)
    assert [outputs[f"r{i}"] for i in range(len(prompts))] == hf_greedy(tiny_path, prompts, MAX_TOKENS)
    records = pd_engine.pop_batch_records()
    assert {r.instance for r in records} == {"prefill-0", "decode-0"}
    prefilled = sum(r.num_prefill_tokens for r in records if r.instance == "prefill-0")
    assert prefilled >= sum(map(len, prompts)) - pd_engine.kv.num_hit_tokens  # whole prompts there
    decode_side = sum(r.num_prefill_tokens for r in records if r.instance == "decode-0")
    assert decode_side <= len(prompts) * BLOCK  # at most each prompt's last block here
    assert not any(pd_engine.kv.pool.ref_counts) and not pd_engine.remote_prefill.held


def test_each_request_records_its_kv_transfer(pd_engine, prompts):
    pd_engine.add_request(prompts[0], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
                          request_id="measured")
    final = None
    while pd_engine.has_unfinished():
        final = next((out for out in pd_engine.step() if out.finished), final)
    metrics = final.metrics
    blocks = (len(prompts[0]) - 1) // BLOCK
    assert metrics.kv_transfer_bytes == blocks * pd_engine.runner.bytes_per_block()
    assert metrics.arrival_time <= metrics.kv_transfer_start <= metrics.kv_transfer_end <= metrics.first_token_time


def test_an_abort_while_prefilling_ends_the_request_once(pd_engine, prompts):
    pd_engine.add_request(prompts[7], SamplingParams(max_tokens=4, ignore_eos=True), request_id="gone")
    out = pd_engine.abort("gone")
    assert out.finished and out.finish_reason == "abort" and pd_engine.abort("gone") is None
    pd_engine.add_request(prompts[1], SamplingParams(max_tokens=2, ignore_eos=True), request_id="after")
    finished = []
    while pd_engine.has_unfinished():
        finished += [o.request_id for o in pd_engine.step() if o.finished]
    assert finished == ["after"]  # the aborted one's KV, if it came, was taken and dropped


@pytest.mark.parametrize(("knobs", "names"), [
    ({"enable_prefix_caching": False}, "cache.enable_prefix_caching"),
    ({"tensor_parallel_size": 2}, "parallel.tensor_parallel_size"),
    ({"runner": "simulated"}, "model.runner"),
])
def test_a_deployment_it_cannot_run_is_refused_before_any_process(tiny_path, knobs, names):
    with pytest.raises(ConfigError, match=names):
        make_pd_engine(tiny_path, **knobs)


def test_an_unknown_disaggregation_names_the_key(tiny_path):
    with pytest.raises(ConfigError, match="parallel.disaggregation"):
        make_pd_engine(tiny_path, disaggregation="2p3q")


def test_a_prefill_instance_that_dies_ends_its_requests_with_the_cause(tiny_path, prompts):
    engine = make_pd_engine(tiny_path)
    try:
        worker = engine.remote_prefill.workers.workers[0].process
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        engine.add_request(prompts[0], SamplingParams(max_tokens=2), request_id="orphan")
        outs = engine.step()
        assert [(o.request_id, o.finish_reason) for o in outs] == [("orphan", RequestStatus.FINISHED_ERROR.value)]
        assert "killed by SIGKILL" in outs[0].error
        with pytest.raises(Exception, match="engine stopped"):
            engine.add_request(prompts[1])
    finally:
        engine.shutdown()
    assert not worker.is_alive()


def test_a_request_goes_to_the_prefill_instance_at_its_arrival_time(pd_engine, prompts):
    due = pd_engine.clock() + 0.3
    pd_engine.add_request(prompts[4], SamplingParams(max_tokens=2, ignore_eos=True), request_id="later",
                          arrival_time=due)
    pd_engine.step()
    assert pd_engine.num_computing_elsewhere == 0 and pd_engine.num_waiting == 1 and pd_engine.has_unfinished()
    final = None
    while pd_engine.has_unfinished():
        final = next((out for out in pd_engine.step() if out.finished), final)
    assert due <= final.metrics.kv_transfer_start <= final.metrics.first_token_time
