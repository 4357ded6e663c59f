"""Seeded simulated runs give pinned results: the digest of every step's outputs, every finished request's
tokens and metrics, and every BatchRecord's scheduling and timing fields (a speed-up must not change what the
real schedulers and KV accounting decide, nor the times the cost models give). The digests were taken before
the simulator was made faster (3dc012e) and held after it; pp2-orca's was taken again when messages past the
largest profiled all-reduce began to take its bandwidth (engine/simulator/ops/comm.py): orca's whole-prompt
batches send such messages. The deployments' digests were taken again when the simulated pipeline went through
the engine's one step path (engine/runner/base.py): the same tokens, metrics and batch timings, but a micro-batch
is recorded when it leaves the last stage, so its KV blocks, waiting and running counts are those after its result
is applied, and a step returns once a micro-batch has finished. Every digest was taken again when the virtual clock
began to keep time in ticks of 2**-30 s (engine/runner/clock.py): the same steps, tokens and counts, every time
within 5 us of before over runs of up to 522 s. Floats are digested to 10 significant digits (``rounded``), so that the pins hold on
CPUs whose vectorised math differs in the last bits."""
import dataclasses
import hashlib
import json

import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.hydra_config import compose, engine_of, override
from stallfree.engine.records import as_row
from stallfree.loadgen.targets.inprocess import replay
from stallfree.loadgen.workload.request_specs import build_workload

CASES = {  # model preset, scheduler, chunk size, workload, QPS, KV blocks (None: the preset's)
    "a100-sarathi": ("mistral7b_a100", "sarathi", 512, "openchat_sharegpt4", 6.0, None),
    "a100-vllm-preempting": ("mistral7b_a100", "vllm", 512, "arxiv", 4.0, 600),
    "a100-hybrid-preempting": ("mistral7b_a100", "hybrid", 512, "arxiv", 4.0, 700),
    "pp2-orca": ("llama2_70b_a40_tp4_pp2", "orca", 512, "openchat_sharegpt4", 2.0, None),
    "pp2-sarathi-preempting": ("llama2_70b_a40_tp4_pp2", "sarathi", 1536, "arxiv", 2.0, 900),
    "fitted-cost-model": ("mistral7b_sim", "chunked_prefill", 256, "arxiv", 4.0, None),
}
DIGESTS = {
    "a100-hybrid-preempting": {"engine": "5225ce936e1fc868", "replay": "84197f380a8a5477"},
    "a100-sarathi": {"engine": "c9e87b4be116a92c", "replay": "9634f7ace702f4a3"},
    "a100-vllm-preempting": {"engine": "8c30cac1f7a2b691", "replay": "d3cd2e2f874e74a4"},
    "fitted-cost-model": {"engine": "19ec815a87d16f83", "replay": "cbc65e8d47da2d79"},
    "pp2-orca": {"engine": "291b8381ee4162e4", "replay": "739b005005bfff05"},
    "pp2-sarathi-preempting": {"engine": "10b05b0dee739a4f", "replay": "00f840160837bf04"},
}


def setup(case: str) -> tuple[LLMEngine, list]:
    model, scheduler, chunk_size, workload, qps, num_blocks = CASES[case]
    cfg = compose("bench", [f"model={model}", f"scheduler={scheduler}", f"workload={workload}",
                            "workload.lengths.scale=1", "workload.max_total_tokens=8192",
                            "scheduler.max_num_batched_tokens=8192", f"scheduler.chunk_size={chunk_size}",
                            override("cache.num_blocks", num_blocks)], "seeded_runs")
    config = engine_of(cfg)
    engine = LLMEngine.from_config(config)
    specs = build_workload({"kind": "poisson", "qps": qps}, cfg["workload"]["lengths"], 60, 7, engine.vocab_size,
                           8192)
    return engine, specs


# The fields a scheduling or timing change shows in: fields added later (utilisation, logprobs, thread counts)
# do not change the pinned digests.
BATCH_FIELDS = ("iteration", "start_time", "end_time", "num_prefill_tokens", "num_decode_tokens", "num_prefill_seqs",
                "num_decode_seqs", "prefill_attention_work", "decode_context_tokens", "num_preemptions",
                "num_kv_blocks_used", "num_waiting", "num_running", "stage_busy_s", "stage_idle_s")
OUTPUT_FIELDS = ("request_id", "prompt_token_ids", "token_ids", "finished", "finish_reason", "metrics")
RECORD_FIELDS_SINCE = ("cached_tokens", "client_wait_s", "session_id", "turn", "session_end", "kv_transfer_bytes",
                       "kv_transfer_start", "kv_transfer_end")  # RequestRecord fields added after the digests were pinned
METRICS_FIELDS = ("arrival_time", "first_scheduled_time", "first_token_time", "token_times", "finish_time",
                  "num_preemptions")


def pick(row: dict, names: tuple[str, ...]) -> dict:
    return {name: row[name] for name in names}


def rounded(value):
    """``value`` with every float to 10 significant digits: numpy's vectorised exp / log differ in the last bits
    between CPUs (AVX-512 and AVX2 code paths), and a digest must change with the simulation, not the machine."""
    if isinstance(value, float):
        return float(f"{value:.10g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(item) for item in value]
    return value


def digest(value) -> str:
    return hashlib.sha256(json.dumps(rounded(value), sort_keys=True, default=repr).encode()).hexdigest()[:16]


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
        finished += [pick(dataclasses.asdict(out), OUTPUT_FIELDS) for out in outputs if out.finished]
    for out in finished:
        out["metrics"] = pick(out["metrics"], METRICS_FIELDS)
    return {"steps": steps, "finished": finished,
            "batches": [pick(as_row(b), BATCH_FIELDS) for b in engine.batch_records]}


def run_replay(case: str) -> dict:
    """A capacity probe's results: the request records and batch rows of an in-process replay."""
    engine, specs = setup(case)
    result = replay(engine, specs)
    records = [{k: v for k, v in as_row(r).items() if k not in RECORD_FIELDS_SINCE} for r in result.records]
    return {"records": records, "batches": [pick(as_row(b), BATCH_FIELDS) for b in result.batches]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_seeded_run_gives_the_pinned_outputs_records_and_metrics(case):
    engine_run, replay_run = run_engine(case), run_replay(case)
    assert sum(len(step) for step in engine_run["steps"]) > 10_000  # every case decodes many tokens
    assert {"engine": digest(engine_run), "replay": digest(replay_run)} == DIGESTS[case]
