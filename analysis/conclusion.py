"""The report's conclusion, written from the data: per experiment and SLO, the capacity ranking of the
configs, the leading policy's ratio to each other policy, whether that difference is larger than the spread
between repeats, and whether the disturbed runs change it. Without an SLO to check, the P99 TBT of the
policies at each QPS.

A capacity is a claim the runs must support: one that passed at the highest QPS tried (a capacity search
whose `hi_qps` is None, a sweep's highest QPS) is a lower bound, written ">= X"; one where no QPS passed is
"< the lowest QPS tried". A ratio takes the same qualifier, and none is given where the order of the two
capacities is not established.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stallfree.analysis import capacity as capacity_data
from stallfree.analysis import paper
from stallfree.analysis.capacity_ranking import (
    BELOW,
    EXACT,
    LOWER,
    Capacity,
    best_per_policy,
    comparison,
    disturbance,
)
from stallfree.analysis.load import PREFIX_SUFFIX, disturbed_mask
from stallfree.analysis.prefix_study import prefix_conclusion
from stallfree.engine.records.server_summary import PREFIX_CACHE_WARN_POINTS

# --- capacities from the results ------------------------------------------------------------------


def _json_records(results_dir: Path) -> list[dict]:
    return [{"experiment": f.parent.name, **record} for f in paper.experiment_files(results_dir, "capacity.json")
            for record in json.loads(f.read_text())]


def _config(record: Mapping) -> str:
    chunk = record.get("chunk_size")
    return (str(record["scheduler"]) + ("" if chunk is None or pd.isna(chunk) else f"-{int(chunk)}")
            + (PREFIX_SUFFIX if record.get("prefix_caching") is True else ""))


def _disturbed_ids(runs: pd.DataFrame) -> set[str]:
    return set(runs.loc[disturbed_mask(runs), "run_id"].astype(str)) if not runs.empty else set()


def _from_search(record: dict, disturbed: set[str], drop_disturbed: bool) -> Capacity | None:
    """A capacity.json record; ``drop_disturbed``: recomputed from its undisturbed points alone (None
    when none is left)."""
    points = [p for p in record["points"] if not (drop_disturbed and p.get("run_id") in disturbed)]
    if not points:
        return None
    min_qps = min(p["qps"] for p in points)
    if drop_disturbed:
        passed = [p["qps"] for p in points if p["passed"]]
        failed = [p["qps"] for p in points if not p["passed"]]
        qps = max(passed, default=0.0)
        bound = BELOW if not passed else EXACT if any(f > qps for f in failed) else LOWER
        repeats: tuple[float, ...] = ()
    else:
        qps = float(record["capacity_qps"])
        repeats = tuple(record.get("capacity_qps_repeats") or [qps])
        bound = BELOW if qps == 0 else EXACT if record.get("bracketed", True) else LOWER
    runs = tuple(p["run_id"] for p in points if p.get("run_id") in disturbed)
    return Capacity(_config(record), str(record["scheduler"]), qps, bound, min_qps, repeats, runs)


def _from_runs(runs: pd.DataFrame, slo_name: str, slo_ms: float, max_delay_ms: float) -> list[Capacity]:
    """Capacities of a sweep's (or a search's probe) runs: the highest passing QPS, a lower bound when it is
    the highest QPS tried; repeats are the capacities of each seed."""
    table = capacity_data.capacity_from_runs(runs, {slo_name: slo_ms}, max_delay_ms)
    table = table[table["slo_name"] == slo_name]
    seeds = runs["seed"].dropna().unique() if "seed" in runs else []
    per_seed = ([capacity_data.capacity_from_runs(runs[runs["seed"] == seed], {slo_name: slo_ms}, max_delay_ms)
                 for seed in seeds] if len(seeds) > 1 else [])
    disturbed = disturbed_mask(runs)
    capacities = []
    for row in table.itertuples():
        tried = runs.loc[runs["config"] == row.config, "qps"]
        qps = float(row.capacity_qps)
        bound = BELOW if qps == 0 else LOWER if qps >= tried.max() else EXACT
        repeats = tuple(float(s.loc[(s["config"] == row.config) & (s["slo_name"] == slo_name), "capacity_qps"].max())
                        for s in per_seed)
        named = tuple(runs.loc[(runs["config"] == row.config) & disturbed, "run_id"].astype(str))
        capacities.append(Capacity(row.config, row.scheduler, qps, bound, float(tried.min()), repeats, named))
    return capacities


@dataclass(frozen=True)
class SloConclusion:
    """What one experiment's results say under one SLO."""
    experiment: str
    slo_name: str
    slo_tbt_ms: float
    source: str  # "capacity.json", "capacity search" or "sweep"
    capacities: list[Capacity]
    undisturbed: list[Capacity] | None  # recomputed without the disturbed runs; None when none was

    def markdown(self) -> str:
        where = {"capacity.json": "capacity search", "capacity search": "capacity-search probes",
                 "sweep": "the sweep's runs (no capacity search ran)"}[self.source]
        return (f"**{self.slo_name} SLO (P99 TBT ≤ {self.slo_tbt_ms:.0f} ms), from {where}.** "
                f"{comparison(self.capacities)} {disturbance(self.capacities, self.undisturbed)}")


def slo_conclusions(results_dir: str | Path, runs: pd.DataFrame, slos: Mapping[str, float],
                    max_delay_ms: float = capacity_data.MAX_SCHEDULING_DELAY_MS) -> list[SloConclusion]:
    """One conclusion per experiment and SLO: from its capacity.json where it has one, else from its runs
    (search probes, checked against their own SLO, or sweep runs, against each of ``slos``)."""
    records = _json_records(Path(results_dir))
    disturbed = _disturbed_ids(runs)
    conclusions = []
    for experiment, slo_name in dict.fromkeys((r["experiment"], r["slo_name"]) for r in records):
        searched = [r for r in records if r["experiment"] == experiment and r["slo_name"] == slo_name]
        capacities = [c for r in searched if (c := _from_search(r, disturbed, False)) is not None]
        dirty = any(c.disturbed_runs for c in capacities)
        undisturbed = ([c for r in searched if (c := _from_search(r, disturbed, True)) is not None]
                       if dirty else None)
        conclusions.append(SloConclusion(experiment, slo_name, float(searched[0]["slo_tbt_ms"]), "capacity.json",
                                         capacities, undisturbed))
    searched_experiments = {r["experiment"] for r in records}
    for experiment, exp_runs in runs.groupby("experiment", sort=False):
        if experiment in searched_experiments:
            continue
        probe_slo = exp_runs.get("capacity_search", pd.Series(None, index=exp_runs.index))
        levels = ({str(name): float(group["slo_tbt_ms"].iloc[0]) for name, group in exp_runs.groupby(probe_slo)}
                  if probe_slo.notna().any() else dict(slos))
        source = "capacity search" if probe_slo.notna().any() else "sweep"
        for slo_name, slo_ms in levels.items():
            subset = exp_runs[probe_slo == slo_name] if source == "capacity search" else exp_runs
            if source == "capacity search":
                subset = subset.drop(columns="capacity_search")  # checked against this SLO, as a sweep
            capacities = _from_runs(subset, slo_name, slo_ms, max_delay_ms)
            clean = subset[~disturbed_mask(subset)]
            undisturbed = (_from_runs(clean, slo_name, slo_ms, max_delay_ms) if not clean.empty else [])
            conclusions.append(SloConclusion(str(experiment), slo_name, slo_ms, source, capacities,
                                             undisturbed if any(c.disturbed_runs for c in capacities) else None))
    return [c for c in conclusions if c.capacities]


def tbt_by_qps(runs: pd.DataFrame, slos: Mapping[str, float]) -> list[str]:
    """Per QPS: the configs by P99 TBT (lowest first) and the SLOs each meets (the Pareto data's verdict)."""
    lines = []
    measured = runs.dropna(subset=["p99_tbt_ms"])
    for qps, group in measured.groupby("qps"):
        if group["config"].nunique() < 2:
            continue
        best = group.sort_values("p99_tbt_ms").drop_duplicates("config")
        cells = []
        for row in best.itertuples():
            met = [name for name, ms in slos.items() if row.p99_tbt_ms <= ms]
            verdict = f"meets {met[0]}" if met else "misses every SLO" if slos else ""
            cells.append(f"{row.config} {row.p99_tbt_ms:.0f} ms" + (f" ({verdict})" if verdict else ""))
        lines.append(f"at {qps:g} QPS: " + ", ".join(cells))
    return lines


def prefix_cache_note(runs: pd.DataFrame) -> str | None:
    """The configs whose server served more of the prompt tokens from its prefix cache than the workload's own
    reuse gives (the medians over their runs PREFIX_CACHE_WARN_POINTS or more apart; a run without
    ``workload_ideal_hit_rate``: none), or None."""
    if runs.empty or "server_prefix_cache_hit_rate" not in runs:
        return None
    ideal = runs["workload_ideal_hit_rate"].fillna(0.0) if "workload_ideal_hit_rate" in runs else 0.0
    by_config = runs.assign(ideal=ideal).groupby("config", sort=False)
    rates = by_config["server_prefix_cache_hit_rate"].median().dropna()
    cached = rates[rates >= by_config["ideal"].median()[rates.index] + PREFIX_CACHE_WARN_POINTS]
    if cached.empty:
        return None
    named = "; ".join(f"{config} served {rate:.0%} of its prompt tokens from its prefix cache"
                      for config, rate in cached.items())
    return (f"**Prefix cache**: {named} (the median over its runs). The runs of a sweep send the same prompts, "
            "so its prefills were mostly skipped: its latencies and capacity are not like for like with an engine "
            "without a prefix cache. Start it without one (vLLM: `--no-enable-prefix-caching`) to compare.")


def conclusion_markdown(results_dir: str | Path, runs: pd.DataFrame, slos: Mapping[str, float],
                        max_delay_ms: float = capacity_data.MAX_SCHEDULING_DELAY_MS) -> str:
    """The report's conclusion section (markdown)."""
    parts = ["# Conclusion"]
    conclusions = slo_conclusions(results_dir, runs, slos, max_delay_ms)
    pooled = len({c.experiment for c in conclusions}) > 1
    for item in conclusions:
        parts.append((f"`{item.experiment}`: " if pooled else "") + item.markdown())
    if not conclusions:
        parts.append("No capacity search ran and there is no SLO to check the runs against.")
    sweep_runs = runs[~runs.get("capacity_search", pd.Series(None, index=runs.index)).notna()] if not runs.empty else runs
    by_qps = tbt_by_qps(sweep_runs, slos) if not sweep_runs.empty else []
    if by_qps:
        slo_text = ", ".join(f"{name} {ms:.0f} ms" for name, ms in slos.items())
        parts.append(f"**P99 TBT at each QPS**, lowest first (SLOs: {slo_text or 'none'}): " + "; ".join(by_qps) + ".")
    if (note := prefix_cache_note(runs)) is not None:
        parts.append(note)
    if (study := prefix_conclusion(results_dir)) is not None:
        parts.append(study)
    return "\n\n".join(parts)


def paper_conclusion(results_dir: str | Path) -> str:
    """The conclusion of the Sarathi-Serve study (analysis.paper): the study's size (with the caveat of a
    reduced one beside every ratio), the ranking in each deployment x trace x SLO, and sarathi's headline
    gains beside the paper's."""
    sizes = paper.study_sizes(results_dir)
    caveat = paper.size_caveat(sizes)
    mark = " †" if caveat else ""
    parts = ["# Conclusion",
             f"**Study size: † {caveat}.**" if caveat
             else f"Study size: {paper.size_text(sizes)}, the preset's full size."]
    records = [r for r in _json_records(Path(results_dir)) if r.get("model") in paper.DEPLOYMENTS]
    disturbed = _disturbed_ids(paper.load_runs(results_dir))
    cells: dict[tuple, list[Capacity]] = {}
    for record in records:
        key = (record["model"], record["workload"], record["slo_name"], record["slo_tbt_ms"])
        cells.setdefault(key, []).append(_from_search(record, disturbed, False))
    leaders = [best_per_policy(caps)[0].scheduler for caps in cells.values()
               if best_per_policy(caps)[0].bound != BELOW]
    counts = ", ".join(f"{policy} in {leaders.count(policy)}" for policy in dict.fromkeys(leaders))
    parts.append(f"**Highest capacity** by deployment × trace × SLO ({len(cells)} of them): {counts or 'none passed'}.")
    parts.append("\n".join(f"* {model}, {trace}, {slo} SLO ({slo_ms:.0f} ms): {comparison(caps, mark)}"
                           for (model, trace, slo, slo_ms), caps in cells.items()))
    head = paper.headline(paper.capacity_table(results_dir))
    ours = head.dropna(subset=["ours"])
    if not ours.empty:
        parts.append("**Beside the paper** (sarathi's highest gain over the baseline; the paper's are \"up to\"): "
                     + "; ".join(f"{r.deployment} over {r.over}: {'≥ ' if r.ours_lower_bound else ''}{r.ours:.2f}x"
                                 f"{mark} ({r.ours_at}) vs the paper's {r.paper:.1f}x" for r in ours.itertuples())
                     + ".")
    missing = head[head["ours"].isna()]
    if not missing.empty:
        parts.append("Not in these results: " + ", ".join(f"{r.deployment} over {r.over}" for r in missing.itertuples())
                     + ".")
    everything = [c for caps in cells.values() for c in caps]
    parts.append(disturbance(everything, None))
    return "\n\n".join(parts)
