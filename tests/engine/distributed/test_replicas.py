"""parallel.data_parallel_size=2: two whole engines in processes of their own behind a router; the greedy tokens
of one engine and of HF transformers, routing by each router's rule, and the faults of a replica."""
import os
import signal

import pytest

from stallfree.engine import LLM, LLMEngine, SamplingParams
from stallfree.engine.config_checks import ConfigError
from stallfree.engine.distributed.router import ROUTERS
from tests.helpers.engine import hf_greedy, make_prompts

MAX_TOKENS = 5
KNOBS = dict(scheduler="sarathi", chunk_size=32, dtype="float32", max_num_seqs=4, max_model_len=512,
             max_num_batched_tokens=256, data_parallel_size=2, startup_timeout_s=60)


@pytest.fixture(scope="module")
def llm(tiny_path):
    llm = LLM(str(tiny_path), router="round_robin", **KNOBS)
    yield llm
    llm.engine.shutdown()


def test_replicas_give_the_tokens_of_hf(llm, tiny_path):
    prompts = make_prompts(6, seed=3)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert [out.token_ids for out in outputs] == hf_greedy(tiny_path, prompts, MAX_TOKENS)
    assert {r.instance for r in llm.engine.pop_batch_records()} == {"replica-0", "replica-1"}
    assert not llm.engine.has_unfinished() and llm.engine.outstanding == [0, 0]


def test_round_robin_takes_turns(llm):
    engine = llm.engine
    for i in range(4):
        engine.add_request([5, 6, 7, 8 + i], SamplingParams(max_tokens=3, ignore_eos=True), request_id=f"rr{i}")
    assert engine.outstanding == [2, 2]
    finished = set()
    while engine.has_unfinished():
        finished |= {out.request_id for out in engine.step(finished_only=True)}
    assert finished == {f"rr{i}" for i in range(4)}


def test_an_abort_ends_a_routed_request_once(llm):
    engine = llm.engine
    engine.add_request(list(range(5, 200)), SamplingParams(max_tokens=50, ignore_eos=True), request_id="gone")
    engine.step()
    out = engine.abort("gone")
    assert out.finished and out.finish_reason == "abort" and engine.abort("gone") is None
    engine.add_request([9, 10, 11], SamplingParams(max_tokens=2, ignore_eos=True), request_id="after")
    seen = []
    while engine.has_unfinished():
        seen += [o.request_id for o in engine.step()]
    assert set(seen) == {"after"}  # nothing more of the aborted one


def test_least_outstanding_picks_the_emptiest_and_takes_turns_among_equals():
    router = ROUTERS["least_outstanding"]()
    assert [router.pick([0, 0, 0]) for _ in range(3)] == [0, 1, 2]
    assert router.pick([3, 1, 2]) == 1
    robin = ROUTERS["round_robin"]()
    assert [robin.pick([9, 0]) for _ in range(3)] == [0, 1, 0]


@pytest.mark.parametrize(("knobs", "names"), [
    ({"tensor_parallel_size": 2}, "parallel.tensor_parallel_size"),
    ({"router": "random"}, "parallel.router"),
    ({"disaggregation": "1p1d", "enable_prefix_caching": True}, "parallel.disaggregation"),
])
def test_a_deployment_it_cannot_run_is_refused_before_any_process(tiny_path, knobs, names):
    with pytest.raises(ConfigError, match=names):
        LLMEngine.from_kwargs(model=str(tiny_path), **(KNOBS | knobs))


def test_a_replica_that_dies_ends_the_requests_with_the_cause(tiny_path):
    engine = LLMEngine.from_kwargs(model=str(tiny_path), **KNOBS)
    try:
        victim = engine.workers.workers[1].process
        for i in range(2):
            engine.add_request([5, 6, 7], SamplingParams(max_tokens=500, ignore_eos=True), request_id=f"r{i}")
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        ended = []
        while engine.has_unfinished():
            ended += [o for o in engine.step() if o.finished]
        assert {o.request_id for o in ended} == {"r0", "r1"}
        assert all(o.finish_reason == "error" and "killed by SIGKILL" in o.error for o in ended)
        with pytest.raises(Exception, match="engine stopped"):
            engine.add_request([5, 6])
    finally:
        engine.shutdown()
    assert not any(w.process.is_alive() for w in engine.workers.workers)


def test_replicas_with_prefix_caching_give_the_tokens_of_one_process(llm, tiny_path):
    prompts = make_prompts(4, seed=5)
    prompts += [p + [9, 9] for p in prompts]  # each prompt's blocks come again
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    cached = LLM(str(tiny_path), router="round_robin", enable_prefix_caching=True, **KNOBS)
    try:
        tokens = [out.token_ids for out in cached.generate(prompts, params)]
    finally:
        cached.engine.shutdown()
    assert tokens == [out.token_ids for out in llm.generate(prompts, params)]
    assert tokens == hf_greedy(tiny_path, prompts, MAX_TOKENS)
