"""Runners on hand-built SchedulerOutputs: no scheduler, no KV-cache manager, only the contract."""
import pytest
import torch

from stallfree.engine import EngineConfig, SamplingParams
from stallfree.engine.fitting.cost_model import CostModel
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.runner.factory import make_runner
from stallfree.engine.runner.simulated import SimulatedRunner
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
    runner, _ = make_runner(config, tiny_path, ArchConfig.from_dir(tiny_path), max_model_len=256, num_blocks=16,
                            dtype=torch.float32, device=torch.device("cpu"), eos_token_ids=set())
    return runner


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


def test_simulated_runner_charges_the_cost_model_and_samples_only_sampling_units():
    cost = CostModel(coefficients={"intercept": 0.01, "num_prefill_tokens": 0.001, "num_decode_seqs": 0.002,
                                   "decode_context_tokens": 1e-5})
    clock = VirtualClock(start=100.0)
    runner = SimulatedRunner(cost, vocab_size=50, eos_token_ids={2}, clock=clock, seed=0)
    output = SchedulerOutput([unit("d", [7], 30, [0, 1, 2, 3], is_prefill=False),
                              unit("p", list(range(40)), 0, [4, 5, 6, 7, 8], samples=False)])
    sampled = runner.execute_model(output).sampled_token_ids
    assert set(sampled) == {"d"} and sampled["d"] != 2 and 0 <= sampled["d"] < 50
    assert clock() == pytest.approx(100.0 + 0.01 + 40 * 0.001 + 1 * 0.002 + 31 * 1e-5)
