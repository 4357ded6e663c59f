"""The decode-graph bookkeeping of the model runner (bucket choice, padding, buffer copies, capture at
startup, replays) and the KV sizing from device memory, run on the CPU.

``StandInGraph`` stands in for ``torch.cuda.CUDAGraph``: it records the forward pass at capture and
replays it by running it again into the captured output tensor. Like a real graph, a replay sees only
what was copied into the persistent buffers, so a step whose inputs the bookkeeping failed to copy
gives stale tokens. Whether the forward pass is capturable is a GPU question (benchmarks/gpu.py).
"""
import functools

import pytest
import torch

from stallfree.engine import EngineConfig, LLMEngine, SamplingParams
from stallfree.engine.attention import SDPAAttention
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.loader import load_model
from stallfree.engine.runner import factory
from stallfree.engine.runner.kv_sizing import GIB, Baseline, MemoryProfile, kv_cache_bytes
from stallfree.engine.runner.model_runner import ModelRunner
from stallfree.engine.scheduler import ScheduledUnit, SchedulerOutput
from tests.helpers.engine import make_prompts, run_staggered

BLOCK_SIZE = 8
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


class StandInGraph:
    """A CPU stand-in for a CUDA graph (see the module docstring); records the order of captures."""

    captured: list[int] = []

    def capture(self, forward):
        self.forward, self.output = forward, forward()
        StandInGraph.captured.append(self.output.shape[0])
        return self.output

    def replay(self) -> None:
        self.output.copy_(self.forward())


class GraphSafeSDPA(SDPAAttention):
    """sdpa declared graph-safe, so the runner takes the graph path on the CPU (the stand-in graph re-runs
    the forward pass: what it needs of the backend is only that it reads the persistent buffers)."""

    cuda_graph_safe = True


@pytest.fixture(scope="module")
def tiny(tiny_path):
    arch = ArchConfig.from_dir(tiny_path)
    return arch, load_model(tiny_path, arch, 256, torch.float32, torch.device("cpu"))


def make_runner(tiny, *, graphs: bool, num_blocks: int | None = 32, **kwargs) -> ModelRunner:
    arch, model = tiny
    attn = GraphSafeSDPA(num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                         scale=arch.head_dim ** -0.5)
    return ModelRunner(model, attn, num_blocks, BLOCK_SIZE, torch.float32, torch.device("cpu"), 0,
                       cuda_graphs=graphs, max_num_seqs=6, max_model_len=256,
                       new_graph=StandInGraph if graphs else None, **kwargs)


def decode(request_id: str, token: int, context: int, table: list[int]) -> ScheduledUnit:
    return ScheduledUnit(request_id, [token], context, False, True, table, GREEDY)


def test_every_bucket_is_captured_at_startup_largest_first(tiny):
    StandInGraph.captured.clear()
    runner = make_runner(tiny, graphs=True)
    assert runner.decode_graphs.buckets == [1, 2, 4, 6]
    assert StandInGraph.captured == [6, 4, 2, 1]
    assert not runner.decode_graphs.replays and runner.decode_graphs.capture_seconds > 0
    assert runner.kv_caches[0][0].shape[1] == 33  # one scratch block past the 32 that requests own


def test_graph_replays_match_eager_steps_and_padding_writes_only_the_scratch_block(tiny):
    eager, graphed = make_runner(tiny, graphs=False), make_runner(tiny, graphs=True)
    prompts = {"a": list(range(5, 25)), "b": list(range(100, 107)), "c": [9, 8, 7], "d": list(range(40, 51))}
    tables = {"a": [3, 7, 1, 20], "b": [0, 9], "c": [12, 2], "d": [5, 30, 31]}  # scattered blocks
    steps = []
    for runner in (eager, graphed):
        sampled = runner.execute_model(SchedulerOutput([
            ScheduledUnit(r, p, 0, True, True, tables[r], GREEDY) for r, p in prompts.items()])).sampled_token_ids
        tokens = {r: [*p, sampled[r]] for r, p in prompts.items()}
        # Decode-only steps of 4, 3 (after "d" finishes: a padded row that held "d" before), 4 and 1
        # sequences; "d" returns with its old row content gone.
        for batch in (["a", "b", "c", "d"], ["a", "b", "c"], ["a", "b", "c", "d"], ["b"]):
            units = [decode(r, tokens[r][-1], len(tokens[r]) - 1, tables[r]) for r in batch]
            for r, t in runner.execute_model(SchedulerOutput(units)).sampled_token_ids.items():
                tokens[r].append(t)
        steps.append(tokens)
    assert steps[0] == steps[1]
    assert graphed.decode_graphs.replays == {4: 3, 1: 1}  # 3 and 4 sequences: bucket 4
    for (k_eager, v_eager), (k_graph, v_graph) in zip(eager.kv_caches, graphed.kv_caches, strict=True):
        # [Hkv, blocks, block_size, D]: every request-owned block identical; padding wrote only block 32
        torch.testing.assert_close(k_graph[:, :32], k_eager, rtol=0, atol=0)
        torch.testing.assert_close(v_graph[:, :32], v_eager, rtol=0, atol=0)


def test_a_step_wider_than_the_graphs_runs_eagerly(tiny):
    runner = make_runner(tiny, graphs=True)
    units = [decode(f"r{i}", 5, 3, [i]) for i in range(7)]  # 7 sequences > max_num_seqs=6
    assert len(runner.execute_model(SchedulerOutput(units)).sampled_token_ids) == 7
    assert not runner.decode_graphs.replays


def test_engine_with_stand_in_graphs_matches_eager_token_for_token(tiny_path, monkeypatch):
    prompts = make_prompts(4, seed=3, max_len=50)
    outputs = {}
    for graphs in (False, True):
        if graphs:
            monkeypatch.setattr(factory, "ModelRunner", functools.partial(ModelRunner, new_graph=StandInGraph))
            monkeypatch.setattr(factory, "make_attention_backend", lambda name, device, dtype, **dims: GraphSafeSDPA(
                **dims))
        engine = LLMEngine(EngineConfig.from_kwargs(
            model=str(tiny_path), dtype="float32", device="cpu", attention_backend="sdpa", scheduler="sarathi",
            chunk_size=32, num_blocks=64, max_num_seqs=4))
        outputs[graphs] = run_staggered(engine, prompts, max_tokens=6, params=SamplingParams(
            max_tokens=6, temperature=0.0, ignore_eos=True))
        replays = sum(engine.runner.decode_graphs.replays.values()) if engine.runner.decode_graphs else 0
        assert (replays > 0) == graphs
    assert outputs[True] == outputs[False]


# -- KV cache sizing from device memory ---------------------------------------------------------------

H200 = dict(total=141 * GIB, free_at_start=140 * GIB)


def test_kv_budget_is_a_fraction_of_total_memory_less_what_the_engine_measured():
    profile = MemoryProfile(**H200, weights_and_activations=16 * GIB, non_torch=1 * GIB, graphs=GIB // 2)
    assert kv_cache_bytes(profile, 0.9) == int(141 * GIB * 0.9 - 17.5 * GIB)  # 109.4 GiB, not 1 GiB
    assert kv_cache_bytes(profile, 0.5) == int(141 * GIB * 0.5 - 17.5 * GIB)


@pytest.mark.parametrize(("profile", "utilization", "message"), [
    (MemoryProfile(total=141 * GIB, free_at_start=100 * GIB, weights_and_activations=0, non_torch=0, graphs=0),
     0.9, r"gpu_memory_utilization=0.9 asks for 126.9 GiB of the GPU's 141.0 GiB, but only 100.0 GiB was free"),
    (MemoryProfile(**H200, weights_and_activations=60 * GIB, non_torch=0, graphs=20 * GIB), 0.5,
     r"gpu_memory_utilization=0.5 \(70.5 GiB\) leaves nothing for the KV cache"),
    (MemoryProfile(**H200, weights_and_activations=0, non_torch=0, graphs=0), 1.5,
     r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
])
def test_kv_budget_errors_name_the_setting(profile, utilization, message):
    with pytest.raises(ValueError, match=message):
        kv_cache_bytes(profile, utilization)


MIB = 2**20


class StandInMemoryProbe:
    """Stands in for torch.cuda's memory counters: a fixed 60 of 64 MiB free (small: the cache is real
    CPU memory), and the peak allocation each measurement reads from ``peaks`` (weights + max-batch
    warm-up, then the decode warm-up)."""

    def __init__(self, peaks: list[int]):
        self.peaks, self.allocated_now = list(peaks), 2 * MIB

    def free_and_total(self):
        return 60 * MIB, 64 * MIB

    def allocated(self):
        return self.allocated_now

    def reserved(self):
        return 0

    def peak_allocated(self):
        return self.peaks.pop(0)

    def reset_peak(self):
        pass


def test_runner_sizes_the_kv_cache_after_warm_ups_at_the_max_batch_and_the_largest_bucket(tiny):
    _, model = tiny
    seen = []
    hook = model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(args[0].numel()))
    probe = StandInMemoryProbe(peaks=[5 * MIB, 2 * MIB + MIB // 4])
    baseline = Baseline.take(probe)  # "before the weights": 2 MiB allocated by someone else already
    try:
        runner = make_runner(tiny, graphs=True, num_blocks=None, max_num_batched_tokens=600,
                             gpu_memory_utilization=0.5, memory=(probe, baseline))
    finally:
        hook.remove()
    # 600 tokens as prompts of <= 255 (max_model_len - 1), a decode pass at bucket 6, then the captures
    assert seen[:2] == [600, 6] and seen[2:] == [6, 4, 2, 1]
    profile = runner.memory_profile
    assert (profile.weights_and_activations, profile.graphs) == (3 * MIB, MIB // 4)
    assert profile.non_torch == 0  # free memory did not drop (the stand-in's figures are fixed)
    expected = int(64 * MIB * 0.5 - 3.25 * MIB) // runner.bytes_per_block()
    assert runner.num_blocks == expected and runner.kv_caches[0][0].shape[1] == expected + 1
