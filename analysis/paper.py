"""The Sarathi-Serve study on simulated GPU deployments (`make paper`): the capacity table with its ratios, the
paper's headline ratios beside the project's, Falcon-180B at TP8 vs TP4-PP2, the scheduling ablation and
pipeline bubbles.

Inputs, in a results dir (an experiment dir such as `results/paper`, or a root holding it):
`capacity.json` (one record per capacity search: deployment `model`, trace `workload`, SLO, policy,
capacity) and `summary.parquet` (one row per run: every probe of the searches and the ablation's runs, with
`median_ttft_ms`, `p99_tbt_ms` and `pipeline_bubble_fraction`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from stallfree.analysis.capacity import with_bound

# The paper's headline capacity gains of sarathi (OSDI'24 abstract and Sec. 5): "up to" over its traces and
# SLOs, by deployment (conf/model) and baseline.
PAPER_RATIOS = {
    ("mistral7b_a100", "vllm"): 2.6,
    ("yi34b_a100_tp2", "vllm"): 3.7,
    ("llama2_70b_a40_tp4_pp2", "vllm"): 4.3,
    ("llama2_70b_a40_tp4_pp2", "orca"): 6.3,
    ("falcon180b_a100_tp4_pp2", "vllm"): 5.6,
}
PAPER_NUM_REQUESTS = 2048  # requests per probe of conf/experiment/paper.yaml: the study's full size
PAPER_FALCON_TP8_RATIO = 4.3  # sarathi at TP4-PP2 over vllm at TP8
FALCON = ("falcon180b_a100_tp4_pp2", "falcon180b_a100_tp8")
DEPLOYMENTS = ("mistral7b_a100", "yi34b_a100_tp2", "llama2_70b_a40_tp4_pp2", *FALCON)
POLICIES = ("vllm", "orca", "sarathi")
ABLATION = ("hybrid", "chunked_prefill", "sarathi")
KEYS = ["deployment", "trace", "slo", "policy"]
TABLE_COLUMNS = [*KEYS, "slo_tbt_ms", "chunk_size", "capacity_qps", "capacity_display", "bracketed", "lower_bound",
                 "ratio_to_vllm",
                 "ratio_to_orca", "p99_tbt_ms", "median_ttft_ms", "median_scheduling_delay_ms",
                 "pipeline_bubble_fraction"]


def experiment_files(results_dir: str | Path, name: str) -> list[Path]:
    """RESULTS_DIR/NAME and RESULTS_DIR/*/NAME (a results dir is an experiment dir or a root holding them)."""
    path = Path(results_dir)
    return sorted(f for pattern in (name, f"*/{name}") for f in path.glob(pattern))


def load_runs(results_dir: str | Path) -> pd.DataFrame:
    """Every run's summary (summary.parquet) of the study's experiments."""
    frames = [pd.read_parquet(f) for f in experiment_files(results_dir, "summary.parquet")]
    runs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["run_id", "model"])
    return runs[runs["model"].isin(DEPLOYMENTS)]


def capacity_table(results_dir: str | Path) -> pd.DataFrame:
    """One row per deployment x trace x SLO x policy: the capacity (``lower_bound``: the highest QPS tried
    passed; ``capacity_display``: as analysis.capacity states it, a bound as ">= X" / "< X"), its ratios to vllm and orca under the same deployment, trace and SLO (none where the baseline's
    capacity is itself a lower bound: their order is not established), and the metrics of the run at the
    capacity (the highest passing probe)."""
    records = [with_bound(r) for f in experiment_files(results_dir, "capacity.json") for r in json.loads(f.read_text())
               if r.get("model") in DEPLOYMENTS and not r.get("prefix_caching")]  # the prefix study's: its own
    if not records:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    table = pd.DataFrame(records).rename(columns={"model": "deployment", "workload": "trace", "slo_name": "slo",
                                                  "scheduler": "policy"})
    table["lower_bound"] = ~table["bracketed"].fillna(True).astype(bool) & (table["capacity_qps"] > 0)
    runs = load_runs(results_dir).set_index("run_id")
    at_capacity = [next((p["run_id"] for p in r["points"] if p["passed"] and p["qps"] == r["lo_qps"]), None)
                   for r in records]
    for column in ("p99_tbt_ms", "median_ttft_ms", "median_scheduling_delay_ms", "pipeline_bubble_fraction"):
        values = runs[column] if column in runs else pd.Series(dtype=float)
        table[column] = [values.get(run_id) if run_id is not None else None for run_id in at_capacity]
    for baseline in ("vllm", "orca"):
        rows = table[table["policy"] == baseline].set_index(["deployment", "trace", "slo"])
        base = rows["capacity_qps"].where(~rows["lower_bound"]).rename(f"base_{baseline}")
        table = table.join(base, on=["deployment", "trace", "slo"])
        table[f"ratio_to_{baseline}"] = table["capacity_qps"] / table[f"base_{baseline}"].where(
            table[f"base_{baseline}"] > 0)
    order = {name: i for i, name in enumerate(DEPLOYMENTS)}
    return (table.assign(_order=table["deployment"].map(order), _policy=table["policy"].map(POLICIES.index))
            .sort_values(["_order", "trace", "slo_tbt_ms", "_policy"]).reindex(columns=TABLE_COLUMNS)
            .reset_index(drop=True))


def write_capacity_table(results_dir: str | Path) -> Path:
    """RESULTS_DIR/capacity_table.csv (``capacity_table``)."""
    path = Path(results_dir) / "capacity_table.csv"
    capacity_table(results_dir).to_csv(path, index=False, float_format="%.4g")
    return path


def _best(table: pd.DataFrame, deployment: str, ratio: str) -> tuple[float | None, str, bool]:
    rows = table[(table["deployment"] == deployment) & (table["policy"] == "sarathi")].dropna(subset=[ratio])
    if rows.empty:
        return None, "", False
    best = rows.loc[rows[ratio].idxmax()]
    return float(best[ratio]), f"{best['trace']}, {best['slo']}", bool(best["lower_bound"])


def headline(table: pd.DataFrame) -> pd.DataFrame:
    """The paper's headline ratios beside the project's: sarathi's highest capacity gain over the baseline
    across the two traces and SLOs (the paper's figures are "up to"), where it was reached, and whether it is
    a lower bound (sarathi's capacity is: the highest QPS tried passed)."""
    rows = []
    for (deployment, baseline), paper in PAPER_RATIOS.items():
        ours, where, lower = _best(table, deployment, f"ratio_to_{baseline}")
        rows.append({"deployment": deployment, "over": baseline, "paper": paper, "ours": ours, "ours_at": where,
                     "ours_lower_bound": lower})
    tp8 = falcon_tp8(table)
    best = tp8.dropna(subset=["sarathi_tp4_pp2_over_vllm_tp8"])
    if not best.empty:
        top = best.loc[best["sarathi_tp4_pp2_over_vllm_tp8"].idxmax()]
        rows.append({"deployment": FALCON[0], "over": "vllm at TP8", "paper": PAPER_FALCON_TP8_RATIO,
                     "ours": float(top["sarathi_tp4_pp2_over_vllm_tp8"]), "ours_at": f"{top['trace']}, {top['slo']}",
                     "ours_lower_bound": bool(top["ratio_lower_bound"])})
    else:
        rows.append({"deployment": FALCON[0], "over": "vllm at TP8", "paper": PAPER_FALCON_TP8_RATIO,
                     "ours": None, "ours_at": "", "ours_lower_bound": False})
    return pd.DataFrame(rows)


def study_sizes(results_dir: str | Path) -> list[int]:
    """The requests per probe of the study's runs (one value unless runs of several sizes are pooled)."""
    runs = load_runs(results_dir)
    sizes = runs["num_requests"].dropna() if "num_requests" in runs else pd.Series(dtype=float)
    return sorted({int(n) for n in sizes})


def size_text(sizes: list[int]) -> str:
    """``256 requests per probe`` (``256 and 2,048 ...`` when sizes are pooled)."""
    return f"{' and '.join(f'{n:,}' for n in sizes) or 'an unknown number of'} requests per probe"


def size_caveat(sizes: list[int]) -> str | None:
    """The caveat every ratio of a study smaller than the preset's carries; None at full size."""
    if not sizes:
        return (f"study size unknown (its runs record no num_requests; the preset's is {PAPER_NUM_REQUESTS:,}): "
                "its capacities and ratios may not be the full study's")
    if max(sizes) >= PAPER_NUM_REQUESTS:
        return None
    return (f"reduced study: {size_text(sizes)}, not the preset's {PAPER_NUM_REQUESTS:,}; "
            "its capacities and ratios are not the full study's")


def with_study_size(table: pd.DataFrame, sizes: list[int]) -> pd.DataFrame:
    """``table`` with a ``study`` column beside its ratios when they carry a caveat (``size_caveat``)."""
    return table if size_caveat(sizes) is None else table.assign(study=f"† {size_text(sizes)}")


def falcon_tp8(table: pd.DataFrame) -> pd.DataFrame:
    """Falcon-180B capacity at TP4-PP2 and TP8 (both on two 4-GPU nodes) by trace, SLO and policy, with sarathi
    at TP4-PP2 over vllm at TP8 (the paper's comparison; none where vllm's capacity at TP8 is a lower bound)
    and whether that ratio is a lower bound (sarathi's capacity is)."""
    falcon = table[table["deployment"].isin(FALCON)]
    ratio = ["sarathi_tp4_pp2_over_vllm_tp8", "ratio_lower_bound"]
    if falcon.empty:
        return pd.DataFrame(columns=["trace", "slo", *ratio])
    shape = {"index": ["trace", "slo"], "columns": ["deployment", "policy"]}
    wide = falcon.pivot_table(values="capacity_qps", **shape)
    bounds = falcon.assign(lower_bound=falcon["lower_bound"].astype(float)).pivot_table(values="lower_bound", **shape)
    wide.columns = bounds.columns = [f"{policy} {'TP8' if d == FALCON[1] else 'TP4-PP2'}" for d, policy in wide.columns]
    if {"sarathi TP4-PP2", "vllm TP8"} <= set(wide.columns):
        base = wide["vllm TP8"].where((wide["vllm TP8"] > 0) & (bounds["vllm TP8"] == 0))
        wide[ratio[0]] = wide["sarathi TP4-PP2"] / base
        wide[ratio[1]] = bounds["sarathi TP4-PP2"] > 0
    else:
        wide[ratio[0]], wide[ratio[1]] = float("nan"), False
    return wide.reset_index()


def ablation(results_dir: str | Path) -> pd.DataFrame:
    """The scheduling ablation's runs (not capacity probes): P50 TTFT and P99 TBT of hybrid batching only,
    chunked prefills only and both, by deployment, trace and load."""
    runs = load_runs(results_dir)
    probe = runs["capacity_search"].notna() if "capacity_search" in runs else pd.Series(False, index=runs.index)
    runs = runs[~probe & runs["scheduler"].isin(ABLATION)]
    columns = ["model", "workload", "qps", "scheduler", "chunk_size", "median_ttft_ms", "p99_tbt_ms",
               "median_scheduling_delay_ms"]
    return (runs.reindex(columns=columns).rename(columns={"model": "deployment", "workload": "trace",
                                                          "scheduler": "policy"})
            .assign(_policy=lambda d: d["policy"].map(ABLATION.index))
            .sort_values(["deployment", "trace", "qps", "_policy"]).drop(columns="_policy").reset_index(drop=True))


def bubbles(results_dir: str | Path) -> pd.DataFrame:
    """Pipeline bubbles by pipelined deployment and policy: the median over every probe of the capacity
    searches of the share of stage time spent idle while the engine had work."""
    runs = load_runs(results_dir)
    if not {"pipeline_bubble_fraction", "pipeline_stages"} <= set(runs):
        return pd.DataFrame(columns=["deployment", "policy", "median_bubble_fraction", "probes"])
    staged = runs[runs["pipeline_stages"].fillna(1) > 1].dropna(subset=["pipeline_bubble_fraction"])
    return (staged.groupby(["model", "scheduler"])["pipeline_bubble_fraction"].agg(["median", "count"])
            .reset_index().rename(columns={"model": "deployment", "scheduler": "policy",
                                           "median": "median_bubble_fraction", "count": "probes"}))
