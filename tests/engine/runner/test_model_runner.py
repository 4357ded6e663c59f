"""The model runner on hand-built SchedulerOutputs: no scheduler, no KV-cache manager, only the contract."""
import pytest
import torch

from stallfree.engine import EngineConfig, SamplingParams
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.runner.factory import RunnerSetup, build_model_runner
from stallfree.engine.scheduler import ScheduledUnit, SchedulerOutput

BLOCK_SIZE = 8
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


def unit(request_id, token_ids, computed, block_table, *, samples=True, is_prefill=True):
    return ScheduledUnit(request_id=request_id, token_ids=token_ids, num_computed_tokens=computed,
                         is_prefill=is_prefill, samples=samples, block_table=block_table, sampling_params=GREEDY)


@pytest.fixture(scope="module")
def model_runner(tiny_path):
    config = EngineConfig.from_kwargs(model=str(tiny_path), dtype="float32", attention_backend="sdpa",
                                      block_size=BLOCK_SIZE)
    return build_model_runner(RunnerSetup(config, tiny_path, ArchConfig.from_dir(tiny_path), max_model_len=256,
                                          num_blocks=16, dtype=torch.float32, device=torch.device("cpu"),
                                          eos_token_ids=set()))


@pytest.fixture(scope="module")
def hf_model(tiny_path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


def hf_next_token(hf_model, token_ids: list[int]) -> int:
    with torch.no_grad():
        return int(hf_model(torch.tensor([token_ids])).logits[0, -1].argmax())


def test_model_runner_prefill_chunks_then_decode_match_hf(model_runner, hf_model):
    a, b = list(range(5, 25)), list(range(100, 107))  # a: 20 tokens in two chunks; b: 7 tokens at once
    tables = {"a": [3, 7, 1], "b": [0, 9]}  # scattered blocks: the runner must follow the tables
    first = SchedulerOutput([unit("a", a[:12], 0, tables["a"], samples=False), unit("b", b, 0, tables["b"])])
    sampled = model_runner.execute_model(first).sampled_token_ids
    assert sampled == {"b": hf_next_token(hf_model, b)}  # a partial chunk samples nothing

    second = SchedulerOutput([unit("b", [sampled["b"]], len(b), tables["b"], is_prefill=False),
                              unit("a", a[12:], 12, tables["a"])])
    sampled_2 = model_runner.execute_model(second).sampled_token_ids
    assert sampled_2 == {"a": hf_next_token(hf_model, a), "b": hf_next_token(hf_model, [*b, sampled["b"]])}

