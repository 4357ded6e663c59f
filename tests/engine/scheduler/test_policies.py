"""Policy invariants over random arrival/length mixes, observed on the real engine's scheduled batches."""
import random
import time
from dataclasses import dataclass

import pytest

from stallfree.engine import SCHEDULERS, LLMEngine, SamplingParams

MAX_NUM_SEQS = 4
CHUNK = 48


@dataclass
class Observed:
    units: list[tuple[str, int, bool, int, int]]  # (request id, new tokens, is_prefill, computed, num_tokens)
    decode_ready: set[str]  # running decodes before scheduling
    running_before: int
    running_after: int
    used_blocks: int


def run_recorded(engine: LLMEngine, seed: int) -> tuple[list[Observed], list[str], dict[str, float]]:
    """Replay a random mix (arrivals spread over a few ms) and record every scheduling decision."""
    rng = random.Random(seed)
    sched = engine.scheduler
    observed: list[Observed] = []
    original = sched.schedule

    def recording_schedule(now):
        ready = {r.request_id for r in sched.running if r.is_decode}
        before = len(sched.running)
        output = original(now)
        observed.append(Observed(
            [(u.request_id, u.num_new_tokens, u.is_prefill, u.num_computed_tokens,
              sched.requests[u.request_id].num_tokens) for u in output.units], ready, before, len(sched.running),
            engine.kv.num_used_blocks))
        return output

    sched.schedule = recording_schedule
    t0 = engine.clock()
    arrivals = {}
    for i in range(14):
        rid = f"r{i:02d}"
        arrivals[rid] = t0 + rng.uniform(0, 0.05)
        prompt = [rng.randrange(3, 2000) for _ in range(rng.choice([1, 5, 20, 60, 130]))]
        engine.add_request(prompt, SamplingParams(max_tokens=rng.randint(1, 12), temperature=0, ignore_eos=True),
                           request_id=rid, arrival_time=arrivals[rid])
    first_scheduled: list[str] = []
    while engine.has_unfinished():
        engine.step()
        for obs_unit in observed[-1].units if observed else []:
            if obs_unit[0] not in first_scheduled:
                first_scheduled.append(obs_unit[0])
        if not observed or not observed[-1].units:
            time.sleep(0.001)
    return [o for o in observed if o.units], first_scheduled, arrivals


@pytest.fixture(params=[0, 1, 2, 3])
def seed(request):
    return request.param


def make_engine(tiny_path, policy, num_blocks=40):
    return LLMEngine.from_kwargs(model=str(tiny_path), scheduler=policy, chunk_size=CHUNK, dtype="float32",
                                 max_num_seqs=MAX_NUM_SEQS, num_blocks=num_blocks, block_size=8,
                                 max_model_len=256, max_num_batched_tokens=256)


@pytest.mark.parametrize("policy", sorted(SCHEDULERS))
def test_common_invariants(policy, seed, tiny_path):
    engine = make_engine(tiny_path, policy)
    observed, first_scheduled, arrivals = run_recorded(engine, seed)
    preempted = sum(r.num_preemptions for r in engine.batch_records)
    if not preempted:
        assert first_scheduled == sorted(arrivals, key=arrivals.get), "FCFS violated"
    for o in observed:
        assert o.running_after <= MAX_NUM_SEQS
        assert o.used_blocks <= engine.num_total_blocks
    assert engine.num_free_blocks == engine.num_total_blocks


@pytest.mark.parametrize("num_blocks", [40, 400])
def test_vllm_never_mixes(seed, tiny_path, num_blocks):
    observed, _, _ = run_recorded(make_engine(tiny_path, "vllm", num_blocks), seed)
    for o in observed:
        assert len({is_prefill for _, _, is_prefill, _, _ in o.units}) == 1


def test_orca_never_splits_prompts(seed, tiny_path):
    observed, _, _ = run_recorded(make_engine(tiny_path, "orca"), seed)
    for o in observed:
        for _, n, is_prefill, computed, num_tokens in o.units:
            assert not is_prefill or (computed == 0 and n == num_tokens)


def test_faster_transformer_admits_only_when_idle(seed, tiny_path):
    observed, _, _ = run_recorded(make_engine(tiny_path, "faster_transformer"), seed)
    for o in observed:
        if any(is_prefill for _, _, is_prefill, _, _ in o.units):
            assert o.running_before == 0
    assert any(o.running_after > 1 for o in observed)  # it does batch several requests


@pytest.mark.parametrize("num_blocks", [40, 400])
def test_sarathi_is_stall_free(seed, tiny_path, num_blocks):
    engine = make_engine(tiny_path, "sarathi", num_blocks)
    observed, _, _ = run_recorded(engine, seed)
    assert any(o.decode_ready and any(p for _, _, p, _, _ in o.units) for o in observed)  # hybrid batches
    for o in observed:
        decodes = {rid for rid, _, is_prefill, _, _ in o.units if not is_prefill}
        prefill_tokens = sum(n for _, n, is_prefill, _, _ in o.units if is_prefill)
        preempted_here = o.decode_ready - decodes
        # A ready decode may be missing only if it was preempted to make room (then nothing else is admitted).
        assert not preempted_here or o.running_after < o.running_before
        assert prefill_tokens <= max(0, CHUNK - len(decodes))


def test_chunked_prefill_alternates(seed, tiny_path):
    observed, _, _ = run_recorded(make_engine(tiny_path, "chunked_prefill", 400), seed)
    is_prefill = [any(p for _, _, p, _, _ in o.units) for o in observed]
    for o in observed:
        assert len({p for _, _, p, _, _ in o.units}) == 1
        assert sum(n for _, n, _, _, _ in o.units) <= max(CHUNK, len(o.units))
    for i in range(1, len(observed)):
        if is_prefill[i - 1] and observed[i].decode_ready:
            assert not is_prefill[i], "two prefill iterations in a row while decodes were waiting"
