"""Seeded simulated runs give the same results as at 3dc012e, before the simulator was made faster: the digest of
every step's outputs, every request's metrics and every BatchRecord is pinned (a speed-up must not change
what the real schedulers and KV accounting decide, nor the times the cost models give)."""
import dataclasses
import hashlib
import json

import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.hydra_groups import compose, engine_kwargs_from_groups
from stallfree.loadgen.results.records import as_row
from stallfree.loadgen.targets.inprocess import replay
from stallfree.loadgen.workload.generate import build_workload

CASES = {  # model preset, scheduler, chunk size, workload, QPS, KV blocks (None: the preset's)
    "a100-sarathi": ("mistral7b_a100", "sarathi", 512, "openchat_sharegpt4", 6.0, None),
    "a100-vllm-preempting": ("mistral7b_a100", "vllm", 512, "arxiv", 4.0, 600),
    "a100-hybrid-preempting": ("mistral7b_a100", "hybrid", 512, "arxiv", 4.0, 700),
    "pp2-orca": ("llama2_70b_a40_tp4_pp2", "orca", 512, "openchat_sharegpt4", 2.0, None),
    "pp2-sarathi-preempting": ("llama2_70b_a40_tp4_pp2", "sarathi", 1536, "arxiv", 2.0, 900),
    "fitted-cost-model": ("mistral7b_sim", "chunked_prefill", 256, "arxiv", 4.0, None),
}
DIGESTS = {
    "a100-hybrid-preempting": {"engine": "dffab26db46bacbd", "replay": "4a5c764930d6b4e8"},
    "a100-sarathi": {"engine": "03d8165abcc858b9", "replay": "d358401c85881a0f"},
    "a100-vllm-preempting": {"engine": "353506275ab3c5ab", "replay": "f909400d0d571b3d"},
    "fitted-cost-model": {"engine": "ca258f63976d0872", "replay": "667efba61fc40bc1"},
    "pp2-orca": {"engine": "e8d18fda7780b978", "replay": "021c5ac427677e7a"},
    "pp2-sarathi-preempting": {"engine": "302f4511672f5ad7", "replay": "23aa0106c20bc094"},
}


def setup(case: str) -> tuple[LLMEngine, list]:
    model, scheduler, chunk_size, workload, qps, num_blocks = CASES[case]
    cfg = compose("bench", [f"model={model}", f"scheduler={scheduler}", f"workload={workload}",
                            "workload.lengths.scale=1", "workload.max_total_tokens=8192",
                            "scheduler.max_num_batched_tokens=8192"], "seeded_runs")
    kwargs = engine_kwargs_from_groups(cfg["model"], cfg["scheduler"], chunk_size)
    engine = LLMEngine.from_kwargs(**kwargs, num_blocks=num_blocks)
    specs = build_workload({"kind": "poisson", "qps": qps}, cfg["workload"]["lengths"], 60, 7, engine.vocab_size,
                           8192)
    return engine, specs


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def run_engine(case: str) -> dict:
    """Every step's outputs (as a server streams them) and every BatchRecord."""
    engine, specs = setup(case)
    for spec in specs:
        engine.add_request(spec.prompt_token_ids, SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
                           request_id=spec.request_id, arrival_time=spec.send_offset_s)
    steps, finished = [], []
    while engine.has_unfinished():
        outputs = engine.step()
        steps.append([(out.request_id, out.new_token_ids, len(out.token_ids), out.finish_reason) for out in outputs])
        finished += [dataclasses.asdict(out) for out in outputs if out.finished]
    return {"steps": steps, "finished": finished, "batches": [as_row(b) for b in engine.batch_records]}


def run_replay(case: str) -> dict:
    """A capacity probe's results: the request records and batch rows of an in-process replay."""
    engine, specs = setup(case)
    result = replay(engine, specs)
    return {"records": [as_row(r) for r in result.records], "batches": result.batches}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_seeded_run_gives_the_pinned_outputs_records_and_metrics(case):
    engine_run, replay_run = run_engine(case), run_replay(case)
    assert sum(len(step) for step in engine_run["steps"]) > 10_000  # every case decodes many tokens
    assert {"engine": digest(engine_run), "replay": digest(replay_run)} == DIGESTS[case]
