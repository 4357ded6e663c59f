"""The characterisation studies' tables, from phases.csv (loadgen/studies): per-token cost of each phase,
the operator split, hybrid vs prefill cost, chunking overhead, and the token-budget helper.

``stallfree-budget RESULTS_DIR --slo-tbt-ms X [--tile N]`` prints the largest tile-aligned chunk size whose
hybrid iteration fits the TBT SLO (Sarathi-Serve's recommendation for the token budget).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

FILE = "phases.csv"
DEFAULT_TILE = 128
SPLIT = ["linear_s", "attention_s", "other_s"]


def find_phases(results_dir: str | Path) -> Path | None:
    """RESULTS_DIR/phases.csv, or the one in an experiment directory below it (None: no study ran)."""
    root = Path(results_dir)
    found = [root / FILE] if (root / FILE).is_file() else sorted(root.glob(f"*/{FILE}"))
    return found[0] if found else None


def load_phases(source: str | Path) -> pd.DataFrame:
    path = Path(source)
    path = path if path.is_file() else find_phases(path)
    if path is None:
        raise FileNotFoundError(f"no {FILE} in {source}: run stallfree-bench +experiment=phases first")
    return pd.read_csv(path).astype({"chunk_size": "Int64", "prompt_tokens": "Int64"})


def title(frame: pd.DataFrame) -> str:
    """The model and the device, for figure titles."""
    first = frame.iloc[0]
    return f"{first['model']} on {first['device']} ({first['dtype']})"


def shape_medians(frame: pd.DataFrame, kind: str, by: list[str]) -> pd.DataFrame:
    """Median iteration time, per-token time, MFU and MBU of the ``kind`` rows, per shape; from the iterations
    without the operator-split timers where there are any (the hooks lengthen a short iteration)."""
    rows = frame[frame.kind == kind].assign(tokens=lambda f: f.prefill_tokens + f.decode_tokens)
    if rows.linear_s.isna().any():
        rows = rows[rows.linear_s.isna()]
    return rows.groupby(by, as_index=False)[["iteration_s", "per_token_ms", "mfu", "mbu", "tokens"]].median()


def split_medians(frame: pd.DataFrame) -> pd.DataFrame:
    """The operator split (median seconds of the sampled iterations) per decode batch, prefill size and hybrid."""
    rows = frame[frame.kind.isin(["decode", "prefill", "hybrid"])].astype({part: float for part in SPLIT})
    rows["shape"] = np.select(
        [rows.kind == "decode", rows.kind == "prefill"],
        ["decode x" + rows.batch_size.astype(str), "prefill " + rows.prefill_tokens.astype(str)],
        "hybrid " + rows.prefill_tokens.astype(str) + "+" + rows.decode_tokens.astype(str))
    sampled = rows[rows.linear_s.notna()]
    medians = sampled.groupby(["kind", "shape"], sort=False)[[*SPLIT, "iteration_s"]].median().reset_index()
    plain = rows[rows.linear_s.isna()].groupby("shape").iteration_s.median()
    return medians.assign(unsampled_s=medians["shape"].map(plain))


def split_check(frame: pd.DataFrame) -> pd.DataFrame | str:
    """split_medians with each shape's sampled sum over its unsampled median; a note when nothing was split."""
    split = split_medians(frame)
    if split.empty:
        return "No sampled operator split (model.op_split_every = 0, or a runner without one)."
    return split.assign(sum_over_unsampled=split[SPLIT].sum(axis=1) / split.unsampled_s).round(4)


def hybrid_vs_prefill(frame: pd.DataFrame) -> pd.DataFrame:
    """Each hybrid (c - k prefill tokens + k decodes) against a prefill-only iteration of c tokens."""
    hybrid = shape_medians(frame, "hybrid", ["chunk_size", "decode_tokens"])
    prefill = shape_medians(frame, "prefill", ["prefill_tokens"]).set_index("prefill_tokens").iteration_s
    hybrid["prefill_only_s"] = hybrid.chunk_size.map(prefill)
    hybrid["ratio"] = hybrid.iteration_s / hybrid.prefill_only_s
    return hybrid[["chunk_size", "decode_tokens", "iteration_s", "prefill_only_s", "ratio"]]


def chunking_overhead(frame: pd.DataFrame) -> pd.DataFrame:
    """Prompt length x chunk size: the median chunked prefill time / the median unchunked one."""
    chunks = frame[frame.kind == "chunk"]
    passes = chunks.groupby(["prompt_tokens", "chunk_size", "repeat"]).iteration_s.sum().reset_index()
    seconds = passes.groupby(["prompt_tokens", "chunk_size"]).iteration_s.median().reset_index()
    whole = seconds[seconds.prompt_tokens == seconds.chunk_size].set_index("prompt_tokens").iteration_s
    seconds["overhead"] = seconds.iteration_s / seconds.prompt_tokens.map(whole)
    grid = seconds.astype({"prompt_tokens": int, "chunk_size": int, "overhead": float})
    return grid.pivot(index="prompt_tokens", columns="chunk_size", values="overhead")


def token_budget(frame: pd.DataFrame, slo_tbt_ms: float, tile: int = DEFAULT_TILE) -> tuple[int, float] | None:
    """The largest multiple of ``tile`` within the measured hybrid chunk sizes whose hybrid iteration
    (interpolated between the measured sizes, each at its most decodes) fits ``slo_tbt_ms``, and its
    predicted time in ms; None when not even the smallest fits."""
    hybrid = shape_medians(frame, "hybrid", ["chunk_size", "decode_tokens"])
    worst = hybrid.sort_values("decode_tokens").groupby("chunk_size").iteration_s.last()
    sizes, ms = worst.index.to_numpy(dtype=float), worst.to_numpy() * 1e3
    candidates = np.arange(tile, sizes.max() + 1, tile)
    candidates = candidates[candidates >= sizes.min()]
    fits = [(int(c), float(np.interp(c, sizes, ms))) for c in candidates if np.interp(c, sizes, ms) <= slo_tbt_ms]
    return fits[-1] if fits else None


def budget_table(frame: pd.DataFrame, slo_tbt_ms: float | None, tile: int = DEFAULT_TILE) -> str:
    """The token budget for ``slo_tbt_ms`` (None: 5x and 25x the batch-1 decode iteration, the strict and
    relaxed SLOs of conf/slo), as a Markdown table."""
    if not (frame.kind == "hybrid").any():
        return "No hybrid iterations: the token budget needs `stallfree-bench +experiment=phases`."
    if slo_tbt_ms is None:
        decode = shape_medians(frame, "decode", ["batch_size"]).set_index("batch_size").iteration_s
        base_ms = float(decode.get(1, decode.iloc[0])) * 1e3 if len(decode) else None
        slos = {} if base_ms is None else {f"strict (5x decode {base_ms:.1f} ms)": 5 * base_ms,
                                           f"relaxed (25x decode {base_ms:.1f} ms)": 25 * base_ms}
    else:
        slos = {"given": slo_tbt_ms}
    lines = [f"| TBT SLO | ms | chunk size (multiple of {tile}) | its hybrid iteration (ms) |", "|---|---|---|---|"]
    for name, ms in slos.items():
        found = token_budget(frame, ms, tile)
        lines.append(f"| {name} | {ms:.1f} | " + (f"{found[0]} | {found[1]:.1f} |" if found else "none fits | |"))
    return "\n".join(lines)


def budget_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stallfree-budget", description=__doc__.splitlines()[-1].strip())
    parser.add_argument("results_dir", type=Path, help="a phases run (its phases.csv, or the directory holding it)")
    parser.add_argument("--slo-tbt-ms", type=float, required=True, help="the TBT SLO (ms)")
    parser.add_argument("--tile", type=int, default=DEFAULT_TILE, help=f"tile size (tokens; default {DEFAULT_TILE})")
    args = parser.parse_args(argv)
    if args.slo_tbt_ms <= 0 or args.tile < 1:
        parser.error("--slo-tbt-ms must be > 0 and --tile >= 1")
    try:
        frame = load_phases(args.results_dir)
    except FileNotFoundError as e:
        print(f"stallfree-budget: error: {e}", file=sys.stderr)
        return 2
    if not (frame.kind == "hybrid").any():
        print("stallfree-budget: error: the run has no hybrid iterations (stallfree-bench +experiment=phases)",
              file=sys.stderr)
        return 2
    found = token_budget(frame, args.slo_tbt_ms, args.tile)
    if found is None:
        print(f"no chunk size that is a multiple of {args.tile} fits a TBT SLO of {args.slo_tbt_ms:g} ms "
              f"({title(frame)}): lower the tile or measure smaller hybrid chunks")
        return 1
    chunk, ms = found
    print(f"chunk_size={chunk}: its hybrid iteration takes {ms:.1f} ms, within the {args.slo_tbt_ms:g} ms TBT SLO "
          f"({title(frame)}, tile {args.tile})")
    return 0


if __name__ == "__main__":
    sys.exit(budget_main())
