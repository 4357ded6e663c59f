"""The SLO fields of a run's summary: an absolute TBT bound, or a multiple of a decode reference.

The decode reference (``decode_iter_ms``) comes, in this order of preference, from
* ``slo.reference_ms``: pinned by the user (method ``pinned``);
* ``slo.reference_cost_model``: a committed cost model's predicted decode step of the probe's shape
  (method ``cost_model``);
* a decode-only probe on the run's target (method ``probe``), or, with ``slo.reference_probe=stallfree``, on
  stallfree's own engine with the run's model in this process (method ``stallfree_probe``: one reference of
  this machine for every contender of a comparison). The probe is robust to a busy machine:
  ``decode_probe.rounds`` bursts of short-prompt requests decode together, the reference is a low
  quantile (``decode_probe.quantile``) of their decode steps, and it is measured twice. Two measurements
  further apart than ``decode_probe.max_spread``, or an engine that got less than
  ``min_engine_cpu_share`` of its CPU, make the attempt disturbed; up to ``decode_probe.attempts``
  attempts are made. The probe measures the run's target (a ``url`` target: the server at that URL).

One SLO per experiment: the reference is measured once, cached per model / target / probe shape in
``exp_dir/.probes/`` (a disturbed one too, flagged) with the CPU it was measured from, and every later run and
capacity point of the experiment on that machine is judged against it (on another CPU it is measured again).
A CPU cost model fitted on another CPU is said so in a loud line (on a real clock). ``rerun=disturbed`` measures a disturbed cached reference again, and
``rerun=all`` any cached one, once per process; a capacity search resolves its SLO once, before its first
point, and hands it to every point.

The summary records ``slo_reference_method``, ``slo_reference_disturbed``, ``slo_reference_spread``,
``slo_reference_measurements_ms``, ``slo_reference_measured_at`` (UTC, ISO 8601) and ``slo_reference_measured_on``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from stallfree.engine.hydra_config import cost_model_file
from stallfree.engine.records import RequestRecord
from stallfree.engine.records.machine import cpu_description, same_cpu
from stallfree.loadgen.config.errors import TargetError
from stallfree.loadgen.config.schema import BenchConfig, TargetGroup, load_group
from stallfree.loadgen.config.views import digest
from stallfree.loadgen.sweep.cpu_share import CpuMonitor
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.targets.base import Target
from stallfree.loadgen.workload.request_specs import build_workload

_probed_here: set[Path] = set()  # probe caches this process wrote (rerun measures each one at most once)


@dataclass(frozen=True)
class Reference:
    decode_iter_ms: float | None  # None: an absolute SLO
    method: str  # absolute | pinned | cost_model | probe
    disturbed: bool
    spread: float | None = None  # |a - b| / min(a, b) of the probe's two measurements
    measurements_ms: tuple[float, ...] = ()
    measured_at: str | None = None  # UTC, ISO 8601 (None: not measured, e.g. pinned)
    measured_on: str | None = None  # the CPU it was measured from (a probe) or fitted on (a cost model)

    def as_summary(self) -> dict:
        return {"decode_iter_ms": self.decode_iter_ms, "slo_reference_method": self.method,
                "slo_reference_disturbed": self.disturbed, "slo_reference_spread": self.spread,
                "slo_reference_measurements_ms": list(self.measurements_ms) or None,
                "slo_reference_measured_at": self.measured_at, "slo_reference_measured_on": self.measured_on}


def decode_steps_ms(records: list[RequestRecord]) -> list[float]:
    """The decode step times of a probe burst: every token gap when the server reported its token times;
    from client times, which a network may bunch, each request's mean gap instead."""
    steps: list[float] = []
    for r in records:
        if r.status != "ok":
            continue
        if r.server_token_times and len(r.server_token_times) > 1:
            steps.extend(np.diff(r.server_token_times) * 1e3)
        elif r.token_times and len(r.token_times) > 1:
            steps.append((r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) * 1e3)
    return steps


def _measure(cfg: BenchConfig, target: Target, seed: int, rounds: int) -> tuple[float, bool]:
    """One measurement: a low quantile of the decode steps of ``rounds`` bursts; whether the engine
    was starved of CPU meanwhile."""
    p = cfg.decode_probe
    lengths = {"kind": "fixed", "prompt": p.prompt_tokens, "output": p.output_tokens}
    steps, errors = [], []
    with CpuMonitor(target.engine_pid, cfg.min_engine_cpu_share) as cpu:
        for round_ in range(rounds):
            specs = build_workload({"kind": "burst"}, lengths, p.num_seqs, seed + round_, target.vocab_size)
            records = target.replay(specs, warmup=0, progress=None).records
            steps += decode_steps_ms(records)
            errors += [r.error for r in records if r.status != "ok"]
    if not steps:
        raise TargetError(f"the decode probe's requests all failed ({errors[0] if errors else 'no tokens'}); "
                          "check that the target is up and serves the model, or pin slo.reference_ms")
    return float(np.quantile(steps, p.quantile)), bool(cpu.report and cpu.report.disturbed)


def probe_reference(cfg: BenchConfig, target: Target, method: str = "probe") -> Reference:
    """After a warm-up measurement, up to ``decode_probe.attempts`` attempts of two measurements each;
    the first clean one, else the one whose measurements agree best, flagged disturbed."""
    p, best = cfg.decode_probe, None
    measured_at = datetime.now(UTC).isoformat(timespec="seconds")
    measured_on = None if cfg.virtual_time else cpu_description()  # a virtual clock's steps are the cost model's
    _measure(cfg, target, cfg.seed, rounds=1)  # a first burst of the probe's shape runs slow (allocation, kernel setup)
    for attempt in range(p.attempts):
        (a, starved_a), (b, starved_b) = (_measure(cfg, target, cfg.seed + 1000 * (2 * attempt + i), p.rounds)
                                          for i in range(2))
        spread = abs(a - b) / max(min(a, b), 1e-9)
        reference = Reference((a + b) / 2, method, spread > p.max_spread or starved_a or starved_b,
                              round(spread, 4), (round(a, 4), round(b, 4)), measured_at, measured_on)
        if not reference.disturbed:
            return reference
        if best is None or reference.spread < best.spread:
            best = reference
    return best


def cost_model_reference(cfg: BenchConfig, path: str) -> Reference:
    """The cost model's decode step of the probe's shape: num_seqs sequences halfway through their output. A CPU
    cost model fitted on another CPU than this one, for runs on a real clock, gets a loud line: its decode step
    is not this machine's, so the SLO is not either."""
    from stallfree.engine import CostModel, IterationFeatures

    p = cfg.decode_probe
    context = p.prompt_tokens + p.output_tokens // 2
    step = IterationFeatures(num_prefill_tokens=0, num_decode_seqs=p.num_seqs, prefill_attention_work=0,
                             decode_context_tokens=p.num_seqs * context)
    model = CostModel.load(path)
    fitted_on = model.fitted_on.get("hardware")
    if model.fitted_on.get("device") == "cpu" and not cfg.virtual_time and same_cpu(fitted_on) is False:
        print(f"[slo] WARNING: slo.reference_cost_model {Path(path).name} was fitted on {fitted_on}; this machine "
              f"is {cpu_description()}: the SLO is 'tbt_multiple x' that machine's decode step, not this one's. "
              "For a reference measured here, drop slo.reference_cost_model (the decode probe) or fit a cost "
              "model here (stallfree-profile)", flush=True)
    return Reference(model.predict(step) * 1e3, "cost_model", False, measured_on=fitted_on)


def decode_reference(cfg: BenchConfig, exp_dir: Path, targets: LiveTarget) -> Reference:
    """The decode reference of the run (see the module docstring)."""
    if cfg.slo.reference_ms is not None:
        return Reference(cfg.slo.reference_ms, "pinned", False)
    if cfg.slo.reference_cost_model is not None:
        return cost_model_reference(cfg, cost_model_file(cfg.slo.reference_cost_model, "slo.reference_cost_model"))
    own = cfg.slo.reference_probe == "stallfree"
    if own:  # the bench's own engine in process, whatever the run's target
        cfg = dataclasses.replace(cfg, target=load_group("target", "inprocess", TargetGroup))
    key = {"model": dataclasses.asdict(cfg.model), "cache": dataclasses.asdict(cfg.cache), "target": cfg.target.kind,
           "url": cfg.target.url, "probe": dataclasses.asdict(cfg.decode_probe)}
    path = exp_dir / ".probes" / f"decode-{digest(key)}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        if same_cpu(cached.get("measured_on")) is False:
            print(f"[slo] the cached decode reference was measured on {cached['measured_on']}; this machine is "
                  f"{cpu_description()}: measuring it here", flush=True)
        elif "method" in cached and (path in _probed_here or not must_probe_again(cfg.rerun, cached["disturbed"])):
            return Reference(cached["decode_iter_ms"], cached["method"], cached["disturbed"], cached["spread"],
                             tuple(cached["measurements_ms"]), cached.get("measured_at"), cached.get("measured_on"))
    if own:  # an engine of its own, closed after the probe: the sweep's live target stays as it is
        probe_targets = LiveTarget()
        try:
            reference = probe_reference(cfg, probe_targets.get(cfg, exp_dir / ".logs"), "stallfree_probe")
        finally:
            probe_targets.close()
    else:
        reference = probe_reference(cfg, targets.get(cfg, exp_dir / ".logs"))
    if reference.disturbed:
        print(f"[slo] decode reference {reference.decode_iter_ms:.2f} ms is disturbed (measurements "
              f"{reference.measurements_ms} ms): every run of the experiment uses it; rerun=disturbed "
              "measures it again", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({**asdict(reference), **key}, indent=2) + "\n")
    tmp.replace(path)
    _probed_here.add(path)
    return reference


def must_probe_again(rerun: str, disturbed: bool) -> bool:
    """Whether ``rerun`` measures a cached reference again (at most once per process)."""
    return rerun == "all" or (rerun == "disturbed" and disturbed)


def resolve_slo(cfg: BenchConfig, exp_dir: Path, targets: LiveTarget) -> dict:
    """SLO fields of the summary: slo_name, slo_tbt_ms (absolute, or tbt_multiple x the decode
    reference) and how the reference was obtained."""
    if cfg.slo.tbt_ms is not None:
        return {"slo_name": cfg.slo.name, "slo_tbt_ms": cfg.slo.tbt_bound_ms(None),
                **Reference(None, "absolute", False).as_summary()}
    reference = decode_reference(cfg, exp_dir, targets)
    return {"slo_name": cfg.slo.name, "slo_tbt_ms": cfg.slo.tbt_bound_ms(reference.decode_iter_ms),
            **reference.as_summary()}


def reference_text(summary: dict) -> str:
    """The reference an SLO used, for a result line: ``absolute``, ``probe 13.2 ms [disturbed]``, ..."""
    method = summary.get("slo_reference_method")
    if method in (None, "absolute"):
        return "absolute"
    disturbed = " [disturbed]" if summary.get("slo_reference_disturbed") else ""
    return f"{method} {summary['decode_iter_ms']:.3g} ms{disturbed}"
