"""Bad input raises a clear error naming the problem; the engine keeps serving the other requests."""
import json

import pytest

from stallfree.engine import LLM, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_path):
    return LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32", max_model_len=128)


@pytest.mark.parametrize(("prompt", "params", "message"), [
    ([], SamplingParams(), "prompt is empty"),
    ("", SamplingParams(), "prompt is empty"),
    ([1] * 128, SamplingParams(), "max_model_len"),
    ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
    ([1, 2], SamplingParams(max_tokens=-3), "max_tokens"),
    ([1, 2], SamplingParams(temperature=-1), "temperature"),
    ([1, 2], SamplingParams(top_p=0), "top_p"),
    ([1, 99999], SamplingParams(), "token ids"),
])
def test_bad_request_rejected_engine_keeps_serving(engine, prompt, params, message):
    good = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0))
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, params)
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == [good]
    assert engine.num_free_blocks == engine.num_total_blocks


def test_request_larger_than_cache_rejected(tiny_path):
    engine = LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32", num_blocks=4, block_size=8)
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request([1] * 20, SamplingParams(max_tokens=50))


def test_unknown_policy(tiny_path):
    with pytest.raises(ValueError, match="unknown scheduler 'fifo'.*sarathi"):
        LLM(str(tiny_path), scheduler="fifo")


def test_unknown_option(tiny_path):
    with pytest.raises(ValueError, match="unknown engine option 'chunksize'"):
        LLM(str(tiny_path), chunksize=3)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="neither a preset"):
        LLM(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="config.json is missing"):
        LLM(str(tmp_path))


def test_unsupported_architecture(tmp_path, tiny_path):
    cfg = json.loads((tiny_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported or missing architecture.*GPT2LMHeadModel"):
        LLM(str(tmp_path))


def test_vllm_budget_below_model_len(tiny_path):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLM(str(tiny_path), scheduler="vllm", max_num_batched_tokens=64, max_model_len=128)


def test_generate_text_and_metrics(tiny_path):
    llm = LLM(str(tiny_path), dtype="float32")
    outs = llm.generate(["Hello there", [4, 5, 6]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [5, 5]
    assert outs[0].text == llm.engine.tokenizer.decode(outs[0].token_ids, skip_special_tokens=True)
    m = outs[1].metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
    assert len(m.token_times) == 5 and m.token_times == sorted(m.token_times)
    assert outs[0].finish_reason == "length"


def test_abort_frees_blocks(tiny_path):
    engine = LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32")
    rid = engine.add_request([1, 2, 3] * 10, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.kv_usage() > 0
    assert engine.abort(rid) and not engine.abort(rid)
    assert not engine.has_unfinished() and engine.kv_usage() == 0
