"""Logprobs and prompt logprobs (SamplingParams) against HF transformers' log_softmax of the same weights,
for prompt and generated tokens, with chunked prompts and batched requests; none computed when not asked."""
from __future__ import annotations

import pytest
import torch

from stallfree.engine import LLMEngine, SamplingParams
from tests.helpers.engine import make_prompts
from tests.helpers.hf_logprobs import hf_log_softmax

TOL = 1e-4


def run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> dict:
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(prompt, p, request_id=f"r{i}")
    done = {}
    while engine.has_unfinished():
        done |= {out.request_id: out for out in engine.step() if out.finished}
    return done


def check_against_hf(path, out, params: SamplingParams) -> None:
    """Every prompt and output token's logprob, rank and top-k equal HF's (the last output token included)."""
    sequence = out.prompt_token_ids + out.token_ids
    reference = hf_log_softmax(path, sequence)
    num_prompt = len(out.prompt_token_ids)
    # (the position predicting the token, its logprob, top-k)
    scored = [(position, lp, params.logprobs) for position, lp in enumerate(out.logprobs, start=num_prompt - 1)]
    if out.prompt_logprobs is not None:
        assert out.prompt_logprobs[0] is None
        scored += [(position, lp, params.prompt_logprobs) for position, lp in enumerate(out.prompt_logprobs[1:])]
    for position, lp, k in scored:
        row = reference[position]
        value = row[lp.token_id]
        assert lp.token_id == sequence[position + 1] and abs(lp.logprob - value.item()) < TOL
        assert 1 + int((row > value + TOL).sum()) <= lp.rank <= 1 + int((row > value - TOL).sum())
        assert len(lp.top) == k
        assert torch.allclose(torch.tensor([v for _, v in lp.top]), row.topk(k).values, atol=TOL)
        assert all(abs(row[i].item() - v) < TOL for i, v in lp.top)  # near-ties may swap ids


@pytest.mark.parametrize(("scheduler", "chunk_size"), [("vllm", 512), ("sarathi", 16), ("chunked_prefill", 7)])
def test_logprobs_equal_hf_for_prompt_and_output_tokens(tiny_path, scheduler, chunk_size):
    engine = LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32", scheduler=scheduler,
                                   chunk_size=chunk_size, max_num_seqs=4)
    prompts = make_prompts(5, seed=3, max_len=60)
    params = [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=2),
              SamplingParams(max_tokens=5, temperature=0.8, seed=1, ignore_eos=True, logprobs=0),
              SamplingParams(max_tokens=4, ignore_eos=True),  # asks nothing, batched with the others
              SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, prompt_logprobs=0, logprobs=20),
              SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=1, prompt_logprobs=1)]
    outs = run(engine, prompts, params)
    for i, p in enumerate(params):
        out = outs[f"r{i}"]
        if p.logprobs is None:
            assert out.logprobs is None and out.prompt_logprobs is None
            continue
        assert len(out.logprobs) == len(out.token_ids)
        assert out.prompt_logprobs is None or len(out.prompt_logprobs) == len(out.prompt_token_ids)
        check_against_hf(tiny_path, out, p)
    assert engine.num_free_blocks == engine.num_total_blocks


def test_sampled_logprobs_are_the_raw_distribution_not_the_tempered_one(tiny_path):
    """As vLLM's default (raw_logprobs): temperature and top-k shape sampling, not the reported logprobs."""
    engine = LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32")
    prompt = make_prompts(3, seed=5, max_len=20)[2]
    params = SamplingParams(max_tokens=4, temperature=0.3, top_k=5, seed=7, logprobs=2, ignore_eos=True)
    check_against_hf(tiny_path, run(engine, [prompt], [params])["r0"], params)


def test_nothing_is_computed_for_requests_that_do_not_ask(tiny_path):
    """The LM head sees one row per sampling request unless prompt logprobs are asked for."""
    engine = LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32", scheduler="sarathi", chunk_size=8)
    rows, results = [], []
    engine.runner.model.lm_head.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    execute = engine.runner.execute_model
    engine.runner.execute_model = lambda output: results.append(execute(output)) or results[-1]
    prompts = make_prompts(4, seed=1, max_len=30)[2:]
    run(engine, prompts, [SamplingParams(max_tokens=2, ignore_eos=True)] * 2)
    assert max(rows) <= 2 and not any(r.sample_logprobs or r.prompt_logprobs for r in results)
    rows.clear()
    run(engine, prompts[:1], [SamplingParams(max_tokens=2, ignore_eos=True, prompt_logprobs=0)])
    assert sum(rows) == len(prompts[0]) - 1 + 2  # every prompt position but the last, and two samples


def test_logprobs_need_a_runner_with_logits():
    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated")
    with pytest.raises(ValueError, match="logprobs"):
        engine.add_request([1, 2, 3], SamplingParams(logprobs=1))
    with pytest.raises(ValueError, match="logprobs must be an integer in \\[0, 20\\]"):
        SamplingParams(logprobs=21).validate()
