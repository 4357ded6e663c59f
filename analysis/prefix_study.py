"""The prefix-caching study (``+experiment=prefix``): each policy's capacity with the engine's prefix cache off and
on, per deployment, workload and SLO, from the capacity searches' records (capacity.json), with the median TTFT of
each search's highest passing point; and the conclusion's lines: how caching moves each policy's capacity and
TTFT, and whether the paper's ranking (sarathi above vllm) holds with caching on."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from stallfree.analysis.load import label_configs
from stallfree.engine.records.run_summary import read_summary

KEYS = ["model", "workload", "slo_name", "config"]
EXACT = "exact"


def _records(results_dir: Path) -> list[dict]:
    """Capacity records of searches that said whether the engine cached prefixes."""
    files = [f for pattern in ("capacity.json", "*/capacity.json") for f in sorted(results_dir.glob(pattern))]
    return [dict(r, experiment=f.parent.name) for f in files for r in json.loads(f.read_text())
            if r.get("prefix_caching") is not None]


def has_prefix_study(results_dir: str | Path) -> bool:
    """Whether a capacity search here ran with the engine's prefix cache on."""
    return any(r["prefix_caching"] for r in _records(Path(results_dir)))


def _ttft_at_capacity(results_dir: Path, record: dict) -> float | None:
    """The median TTFT (ms) of the search's highest passing point, from that run's summary."""
    passed = [p for p in record.get("points", []) if p["passed"] and p.get("run_id")]
    if not passed:
        return None
    summary = results_dir / record["experiment"] / max(passed, key=lambda p: p["qps"])["run_id"] / "summary.json"
    if not summary.is_file():
        summary = results_dir / max(passed, key=lambda p: p["qps"])["run_id"] / "summary.json"
    return read_summary(summary).latency["ttft"].median if summary.is_file() else None


def prefix_table(results_dir: str | Path) -> pd.DataFrame:
    """One row per model x workload x SLO x policy config (without the cache mark): capacity off and on (qps, and
    as text with its bound), their ratio (both exact only), and the median TTFT at each one's capacity."""
    results_dir = Path(results_dir)
    records = _records(results_dir)
    if not records:
        return pd.DataFrame()
    frame = pd.DataFrame([{"model": r["model"], "workload": r["workload"], "slo_name": r["slo_name"],
                           "scheduler": r["scheduler"], "chunk_size": r["chunk_size"], "caching": bool(
                               r["prefix_caching"]), "capacity_qps": r["capacity_qps"],
                           "capacity_bound": r["capacity_bound"], "capacity_display": r["capacity_display"],
                           "ttft_ms": _ttft_at_capacity(results_dir, r)} for r in records])
    frame = label_configs(frame)
    columns = ["capacity_qps", "capacity_bound", "capacity_display", "ttft_ms"]
    sides = [frame[frame["caching"] == on].set_index(KEYS)[columns].add_suffix(suffix)
             for on, suffix in ((False, "_off"), (True, "_on"))]
    order = list(dict.fromkeys([*sides[0].index, *sides[1].index]))  # the searches' order
    table = pd.concat([side.reindex(order) for side in sides], axis=1)
    table.index = pd.MultiIndex.from_tuples(order, names=KEYS)
    exact = (table["capacity_bound_off"] == EXACT) & (table["capacity_bound_on"] == EXACT)
    table["capacity_ratio"] = (table["capacity_qps_on"] / table["capacity_qps_off"]).where(
        exact & (table["capacity_qps_off"] > 0))
    return table.reset_index()


def _ranking(cell: pd.DataFrame, side: str) -> list[str]:
    ranked = cell.dropna(subset=[f"capacity_qps_{side}"]).sort_values(f"capacity_qps_{side}", ascending=False)
    return list(ranked["config"])


def prefix_conclusion(results_dir: str | Path) -> str | None:
    """The conclusion's lines on the prefix study, or None without its records."""
    table = prefix_table(results_dir)
    if table.empty:
        return None
    lines = []
    for (model, workload, slo), cell in table.groupby(["model", "workload", "slo_name"], sort=False):
        moves = []
        for row in cell.itertuples():
            ratio = f" ({row.capacity_ratio:.2f}x)" if pd.notna(row.capacity_ratio) else ""
            ttft = (f", TTFT p50 at capacity {row.ttft_ms_off:.0f} -> {row.ttft_ms_on:.0f} ms"
                    if pd.notna(row.ttft_ms_off) and pd.notna(row.ttft_ms_on) else "")
            moves.append(f"{row.config} {row.capacity_display_off} -> {row.capacity_display_on}{ratio}{ttft}")
        off, on = _ranking(cell, "off"), _ranking(cell, "on")
        holds = _sarathi_above_vllm(cell)
        verdict = ("the paper's ranking holds (sarathi above vllm)" if holds else
                   "the paper's ranking does not hold (vllm at or above sarathi)" if holds is not None else
                   "the ranking needs both vllm and sarathi")
        lines.append(f"* {model}, {workload}, {slo} SLO: " + "; ".join(moves)
                     + f". Ranking without caching: {' > '.join(off)}; with it: {' > '.join(on)}: {verdict}.")
    return "**Prefix caching** (capacity off -> on; qps of sessions):\n\n" + "\n".join(lines)


def _sarathi_above_vllm(cell: pd.DataFrame) -> bool | None:
    """Whether sarathi's best capacity with caching on passes vllm's (None: one of them is missing)."""
    on = cell.set_index("config")["capacity_qps_on"]
    sarathi = on[[config.startswith("sarathi") for config in on.index]].max()
    vllm = on.get("vllm")
    return None if pd.isna(sarathi) or vllm is None or pd.isna(vllm) else bool(sarathi > vllm)
