"""Engines side by side (`+experiment=compare`, loadgen.sweep.side_by_side): the contenders measured or missing
(`compare.json`), and each engine's capacity with its ratio to the baseline engine.

Engines are ordered by `engine_order`: servers the bench did not start (the reference, e.g. vLLM) first,
then stallfree's policies; the baseline of the ratios is the first measured one. A capacity the search
did not bracket is a bound: ">= X" when `capacity.max_qps` still passed, "< X" when even the lowest QPS
tried failed. A ratio is computed from the two capacities' intervals, so a ratio with a bound in it is a
bound itself (">= 1.2x") or unknown ("?"), never a figure the runs cannot support.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from stallfree.analysis.load import engine_labels
from stallfree.engine.records.policies import POLICIES

RECORD_KEYS = ["contender", "status", "reason", "target", "scheduler", "chunk_size", "slo_name", "slo_tbt_ms",
               "slo_reference_method", "capacity_qps", "bracketed", "lo_qps", "hi_qps"]
COLUMNS = ["experiment", "engine", *RECORD_KEYS, "capacity_text", "baseline", "ratio", "ratio_text", "run_ids"]


def engine_order(engines: pd.Series, external: pd.Series) -> list[str]:
    """Engines (`external`: a server the bench did not start) in report order: external ones first, then
    stallfree's in `POLICIES` order, each group by name."""
    policy = {f"stallfree {p}": i for i, p in enumerate(POLICIES)}
    rank = {engine: (not ext, policy.get(engine.split("-")[0], len(POLICIES)), engine)
            for engine, ext in zip(engines, external, strict=True)}
    return sorted(rank, key=rank.get)


def load_compare(results_dir: str | Path) -> pd.DataFrame:
    """One row per contender of every `compare.json` at `results_dir` or in its experiment dirs, with its
    `engine`, `capacity_text`, its `ratio` (exact ratios only) / `ratio_text` to the `baseline` and the
    `run_ids` it measured (QPS points and capacity probes); rows in `engine_order`."""
    path = Path(results_dir)
    rows = [{"experiment": f.parent.name, **row} for pattern in ("compare.json", "*/compare.json")
            for f in sorted(path.glob(pattern)) for row in json.loads(f.read_text())]
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.DataFrame(rows).reindex(columns=["experiment", *RECORD_KEYS])
    frame["run_ids"] = [[*row.get("run_ids", []), *(p["run_id"] for p in row.get("points", []))] for row in rows]
    measured = frame["status"].eq("measured")
    frame["engine"] = engine_labels(frame).where(measured, frame["contender"])
    order = engine_order(frame["engine"], frame["target"].eq("url") | ~measured)
    frame = frame.assign(_order=frame["engine"].map(order.index)).sort_values(["experiment", "_order"])
    frame["capacity_text"] = [capacity_text(row) if row.status == "measured" else "missing" for row in frame.itertuples()]
    return pd.concat([_ratios(group) for _, group in frame.groupby("experiment", sort=False)]) \
        .reindex(columns=COLUMNS).reset_index(drop=True)


def compare_runs(runs: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The runs (`load.load_runs`) the contenders of `table` measured, with their `engine`: runs left in the
    experiment dir by earlier settings are not theirs."""
    measured = {run_id for run_ids in table["run_ids"] for run_id in run_ids}
    runs = runs[runs["run_id"].isin(measured)]
    return runs.assign(engine=engine_labels(runs))


def capacity_text(row) -> str:
    """A capacity record's capacity as the search supports it: exact, ">= X" or "< X"."""
    if row.bracketed:
        return f"{row.capacity_qps:.3g}"
    if pd.notna(row.lo_qps):
        return f">= {row.capacity_qps:.3g}"
    return f"< {row.hi_qps:.3g}"


def capacity_interval(row) -> tuple[float, float]:
    """What a capacity record says the capacity is in: [c, c], [c, inf) or [0, lowest failing qps)."""
    if row.bracketed:
        return row.capacity_qps, row.capacity_qps
    if pd.notna(row.lo_qps):
        return row.capacity_qps, np.inf
    return 0.0, row.hi_qps


def ratio_text(lo: float, hi: float) -> str:
    if lo == hi:
        return f"{lo:.2f}x"
    if np.isfinite(hi) and lo == 0:
        return f"<= {hi:.2f}x"
    if not np.isfinite(hi) and lo > 0:
        return f">= {lo:.2f}x"
    return "?"


def _ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """The ratios of one experiment's engines to its first measured one."""
    measured = frame[frame["status"].eq("measured")]
    if measured.empty:
        return frame.assign(baseline=None, ratio=np.nan, ratio_text="")
    baseline = next(measured.itertuples())
    base_lo, base_hi = capacity_interval(baseline)

    def ratio(row) -> tuple[float, str]:
        if row.status != "measured":
            return np.nan, ""
        if row.Index == baseline.Index:  # 1x by definition, bounded or not
            return 1.0, ratio_text(1.0, 1.0)
        lo, hi = capacity_interval(row)
        with np.errstate(divide="ignore"):  # over a baseline that passed nothing: no upper bound
            lo, hi = float(np.divide(lo, base_hi)), float(np.divide(hi, base_lo))
        return (lo if lo == hi else np.nan), ratio_text(lo, hi)

    ratios, texts = zip(*(ratio(row) for row in frame.itertuples()), strict=True)
    return frame.assign(baseline=baseline.engine, ratio=list(ratios), ratio_text=list(texts))


def compare_note(table: pd.DataFrame) -> str:
    """Markdown: the contenders and their engines, the missing ones and why, and the SLO they were held to
    (loudly, when it differs between them: their capacities do not compare then)."""
    if table.empty:
        return "**No comparison**: no `compare.json` (run `stallfree-bench +experiment=compare` first)."
    measured = table[table["status"].eq("measured")]
    notes = ["Contenders: " + ", ".join(f"`{r.contender}` ({r.engine})" for r in measured.itertuples()) + "."]
    notes += [f"**Missing: `{r.contender}`** ({r.reason})." for r in table[~table["status"].eq("measured")].itertuples()]
    slos = measured.drop_duplicates(["slo_name", "slo_tbt_ms"])
    if len(slos) == 1:
        slo = slos.iloc[0]
        notes.append(f"Capacity: the highest QPS with P99 TBT <= {slo['slo_tbt_ms']:.0f} ms ({slo['slo_name']}, "
                     f"{slo['slo_reference_method']}) for every engine; ratios to {measured['baseline'].iloc[0]}.")
    elif len(slos) > 1:
        notes.append("**The engines were held to different SLOs** (" + ", ".join(
            f"{r.engine}: {r.slo_tbt_ms:.0f} ms" for r in measured.itertuples()) + "): their capacities do not "
            "compare; pin one (`slo.tbt_ms`, `slo.reference_ms` or `slo.reference_cost_model`).")
    return " ".join(notes)
