"""One measured point: plan it, replay its workload on the live target, write its run directory and
rebuild the experiment's summary.parquet. A run whose directory already holds summary.json is read
back instead (resume); a directory without it (an interrupted write) is measured again. Jobs running
in parallel (joblib, SLURM) write and rebuild under the experiment's lock (loadgen.sweep.experiment_lock).
``rerun=disturbed`` measures a complete run again when it (or its SLO reference) was disturbed or the
target failed during it, ``rerun=all`` (``--force``) every run.

A target that dies during a run leaves every request a row (status ``error``, its cause); the run is kept,
marked ``failed_run`` with its ``failed_reason``, and the sweep goes on. Only a run none of whose requests
completed is a TargetError. What each request carried (``prompt_form``, ``ignore_eos``) and how many ended
before max_tokens (loadgen.results.output_lengths) are in the summary."""
from __future__ import annotations

import dataclasses
import time

from tqdm import tqdm

from stallfree.engine.records import BatchRecord, RequestRecord
from stallfree.engine.records.quantile_bounds import prefill_gaps
from stallfree.engine.records.request_metrics import (
    COMPLETION_METHOD,
    UnloadedTtft,
    pipeline_summary,
    summarize,
)
from stallfree.engine.records.run_summary import RunSummary, read_summary
from stallfree.engine.records.server_summary import prefix_cache_warning
from stallfree.loadgen.config.errors import TargetError
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.views import workload_tokenizer
from stallfree.loadgen.openai_client.completions import lost_connection
from stallfree.loadgen.results.output_lengths import early_stop_warning, output_length_summary
from stallfree.loadgen.results.run_dir import (
    is_complete,
    rebuild_experiment_summary,
    requests_frame,
    write_run,
)
from stallfree.loadgen.results.summary_block import result_block
from stallfree.loadgen.sweep.cpu_share import CpuMonitor, CpuReport, placement
from stallfree.loadgen.sweep.experiment_lock import experiment_lock
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.plan import RunPlan, plan_run
from stallfree.loadgen.sweep.progress import RunPart, current
from stallfree.loadgen.sweep.slo import reference_text, resolve_slo
from stallfree.loadgen.targets.server_metrics import ServerMetrics, not_scraped
from stallfree.loadgen.workload.prefix_reuse import ideal_hit_rate
from stallfree.loadgen.workload.request_specs import build_workload


def _fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _disturbed_text(s: dict) -> str:
    reason = s.get("disturbed_reason")
    return f" [disturbed: {reason}]" if reason else " [disturbed]"


def _report(status: str, plan: RunPlan, s: dict) -> None:
    if s.get("failed_run"):
        status = "failed"
    print(f"[{status}] {plan.run_id}: {s['completed']} ok / {s['failed']} failed, "
          f"p99 TBT {_fmt(s['p99_tbt_ms'])} ms (SLO {_fmt(s['slo_tbt_ms'], '.0f')}, {reference_text(s)}), "
          f"median TTFT {_fmt(s['median_ttft_ms'])} ms, {_fmt(s['output_throughput'])} tok/s"
          + (" [client fell behind]" if s["client_fell_behind"] else "")
          + (_disturbed_text(s) if s.get("disturbed") else "")
          + (f" [failed run: {s['failed_reason']}]" if s.get("failed_run") else ""),
          flush=True)
    for warning in (early_stop_warning(s), prefix_cache_warning(s)):
        if warning is not None:
            print(f"  {warning}", flush=True)


def target_failure(records: list[RequestRecord]) -> str | None:
    """Why the run failed as a whole, in one line: requests lost their connection (a target that died or
    dropped them); None when every failure was an answer of the target's."""
    lost = [r for r in records if r.status == "error" and lost_connection(r.error)]
    if not lost:
        return None
    return (f"{len(lost)} of {len(records)} requests lost the connection to the target (the first: "
            f"{lost[0].error}); did it die?")


def repeat_configs(cfg: BenchConfig) -> list[BenchConfig]:
    """One config per repeat of a point (``repeats``): seeds seed, seed + 1, ... (the repeats of a
    point share its ``point_id``)."""
    return [dataclasses.replace(cfg, seed=cfg.seed + repeat) for repeat in range(cfg.repeats)]


def repeat_part(repeat_cfg: BenchConfig, repeat: int, share: float = 1.0) -> RunPart:
    """The place in its job of a run of repeat ``repeat`` (a config of repeat_configs) that ends
    ``share`` of the way through the repeat."""
    extras = {"seed": repeat_cfg.seed} if repeat_cfg.repeats > 1 else {}
    return RunPart((repeat + share) / repeat_cfg.repeats, extras)


def run_repeats(cfg: BenchConfig, targets: LiveTarget) -> list[dict]:
    """Measure every repeat of the config's point; return their summaries."""
    return [run_point(repeat_cfg, targets, part=repeat_part(repeat_cfg, repeat))
            for repeat, repeat_cfg in enumerate(repeat_configs(cfg))]


def cpu_summary(report: CpuReport | None, virtual_time: bool, requests: int = 0) -> dict:
    """The run's CPU report for its summary, with the load generator's CPU per request sent (``requests``).
    On a virtual clock the results do not depend on the CPU the engine got, so such a run is never
    ``disturbed`` (and never measured again for it)."""
    if report is None:
        return {"disturbed": None}
    per_request = None if report.loadgen_cpu_s is None or not requests else report.loadgen_cpu_s * 1e3 / requests
    return {**dataclasses.asdict(report), "loadgen_cpu_ms_per_request": per_request,
            "disturbed": report.disturbed and not virtual_time,
            "disturbed_reason": None if virtual_time else report.disturbed_reason}


def server_metrics_summary(metrics: ServerMetrics | None, records: list[RequestRecord],
                           batches: list[BatchRecord] | None = None) -> dict:
    """The run's server metrics for its summary, over the arrival window of its measured requests (first
    to last intended send); ``metrics`` None: a target without a server (inprocess), whose prefix-cache hit
    rate its engine's iterations count (``batches``: the tokens each admitted and took from its cache)."""
    sends = [r.intended_send_time for r in records if not r.is_warmup]
    summary = (metrics or not_scraped("no server to scrape (target=inprocess)")).summary(
        (min(sends), max(sends)) if sends else None)
    if metrics is None and batches:
        queried = sum(batch.prefix_cache_queried_tokens for batch in batches)
        cached = sum(batch.num_cached_tokens for batch in batches)
        summary["server_prefix_cache_hit_rate"] = cached / queried if queried else None
    return summary


def must_rerun(rerun: str, summary: dict) -> bool:
    """Whether ``rerun`` (none | disturbed | all) measures a complete run with this summary again. A capacity
    point without the fields its keep-pace rules judge, or any run whose completion ratio was counted another
    way (measured by an earlier version), always is."""
    disturbed = bool(summary.get("disturbed") or summary.get("slo_reference_disturbed") or summary.get("failed_run"))
    judged = summary.get("capacity_search") is not None or summary.get("completion_ratio") is not None
    outdated = judged and summary.get("completion_method") != COMPLETION_METHOD
    return outdated or rerun == "all" or (rerun == "disturbed" and disturbed)


def _kept_summary(plan: RunPlan, rerun: str) -> dict | None:
    """The summary of the point's complete run when it stands (must_rerun says no), else None."""
    if not is_complete(plan.run_dir):
        return None
    summary = read_summary(plan.run_dir / "summary.json").flat()
    return None if must_rerun(rerun, summary) else summary


def run_point(cfg: BenchConfig, targets: LiveTarget, capacity_slo: str | None = None, rerun: bool = False,
              part: RunPart | None = None, slo: dict | None = None, unloaded_ttft: UnloadedTtft | None = None) -> dict:
    """Measure one point (or read it back when complete); return its summary. ``rerun``: measure it
    again as a run of its own (loadgen.sweep.plan.plan_run). ``part``: its place in the job, for the progress
    line (loadgen.sweep.progress). ``slo``: the SLO fields resolved once for a whole capacity search (else
    resolved here); ``unloaded_ttft``: the baseline of the client-side scheduling delay."""
    started, progress = time.monotonic(), current()
    plan = plan_run(cfg, capacity_slo, rerun)
    part = part or RunPart()
    if rerun:
        part = RunPart(part.done, {**part.extras, "rerun": 1})
    point = {key: plan.params[key] for key in ("scheduler", "chunk_size", "qps") if plan.params[key] is not None}
    if (summary := _kept_summary(plan, cfg.rerun)) is not None:
        _report("cached", plan, summary)
        progress.run_ended(point, part, time.monotonic() - started, cached=True, summary=summary)
        return summary
    slo = slo or resolve_slo(cfg, plan.exp_dir, targets)
    target = targets.get(cfg, plan.exp_dir / ".logs")
    specs = build_workload(cfg.arrival.settings(), cfg.workload.lengths, cfg.num_requests,
                           cfg.seed, target.vocab_size, cfg.workload.max_total_tokens,
                           tokenizer=workload_tokenizer(cfg))
    desc = f"[{progress.position()}{progress.eta()}] {plan.run_id}"
    where = placement(cfg.target.kind == "inprocess", target.engine_pid, target.client_nice)
    # an engine elsewhere: the load generator is watched instead when it is this process (not Locust's)
    client_side = cfg.target.kind == "url"
    with (CpuMonitor(target.engine_pid, cfg.min_engine_cpu_share, client_side) as cpu,
          tqdm(total=len(specs), desc=desc[:80], unit="req", leave=False, disable=None) as bar):
        replay = target.replay(specs, warmup=cfg.warmup, progress=lambda record: bar.update())
    if any(r.status == "aborted" for r in replay.records):  # the HTTP replay returns its records on Ctrl-C
        raise KeyboardInterrupt(f"{plan.run_id} was interrupted; nothing recorded")
    if all(r.status == "error" for r in replay.records):
        raise TargetError(f"all {len(replay.records)} requests of {plan.run_id} failed (the first: "
                          f"{replay.records[0].error}); check the target (a server that died? its log is in "
                          f"{plan.exp_dir / '.logs'}). Nothing recorded")
    failure = target_failure(replay.records)
    flat = {"experiment": cfg.experiment_name, "run_id": plan.run_id, **plan.params, **slo,
               "prompt_form": target.request_shape.prompt_form, "ignore_eos": target.request_shape.ignore_eos,
               "failed_run": failure is not None, "failed_reason": failure,
               **summarize(requests_frame(replay.records), slo_tbt_ms=slo["slo_tbt_ms"],
                           slo_ttft_ms=cfg.slo.ttft_ms, goodput=cfg.slo.goodput, unloaded_ttft=unloaded_ttft),
               **output_length_summary(replay.records),
               **pipeline_summary(replay.batches),
               **cpu_summary(cpu.report, virtual_time=cfg.virtual_time, requests=len(specs)),
               **server_metrics_summary(replay.server_metrics, replay.records, replay.batches),
               "tbt_prefill_gaps": prefill_gaps([r.server_token_times for r in replay.records
                                                 if r.status == "ok" and not r.is_warmup], replay.batches),
               "prefix_cache_reset": replay.prefix_cache_reset,
               "workload_ideal_hit_rate": ideal_hit_rate(
                   [s.prompt_token_ids for s in sorted(specs, key=lambda s: s.send_offset_s)], cfg.cache.block_size),
               **dataclasses.asdict(where)}
    run_summary = RunSummary.from_flat(flat, plan.run_id)
    summary = run_summary.flat()
    with experiment_lock(plan.exp_dir):
        if (kept := _kept_summary(plan, cfg.rerun)) is not None:  # a parallel job measured it first: keep its run
            summary = kept
        else:
            run_dir = write_run(plan.exp_dir, plan.run_id, config=plan.config, requests=replay.records,
                                summary=run_summary, batches=replay.batches,
                                server_metrics=None if replay.server_metrics is None else replay.server_metrics.rows)
            target.finalize(run_dir)
        rebuild_experiment_summary(plan.exp_dir)
    _report("done", plan, summary)
    if replay.server_metrics is not None and replay.server_metrics.reason and cfg.target.metrics_interval_s:
        print(f"[server metrics] {plan.run_id}: none ({replay.server_metrics.reason})", flush=True)
    print(result_block(summary), flush=True)
    progress.run_ended(point, part, time.monotonic() - started, cached=False, summary=summary)
    return summary
