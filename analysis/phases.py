"""The characterisation studies' tables, from phases.csv (loadgen/studies): per-token cost of each phase,
the operator split, hybrid vs prefill cost, chunking overhead, and the token-budget helper.

``stallfree-budget RESULTS_DIR --slo-tbt-ms X [--tile N] [--decode-batch B] [--margin M]`` prints the largest
tile-aligned chunk size whose hybrid iteration's tail, with B decodes in it, fits the TBT SLO with a margin.
"""
from __future__ import annotations

import argparse
import importlib.resources
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

FILE = "phases.csv"
DEFAULT_TILE = 128
SPLIT = ["linear_s", "attention_s", "other_s"]
TAIL_QUANTILE = 0.99  # TBT SLOs bound the P99 token gap
# The SLO's room beyond the predicted P99: served iterations run beside the server and the load generator on
# a busier CPU, and a token gap is an iteration plus the time between iterations. Served on the 2-core Xeon
# at 4 QPS, sarathi-256's P99 TBT was 42.7-48.3 ms, up to 16% over its predicted P99 iteration (41.6 ms,
# from that machine's cost model; benchmarks/results/budget_check_4qps.json): twice that.
DEFAULT_MARGIN = 0.3


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


def default_decode_batch() -> int:
    """The decodes in the iteration the SLO's reference measures (conf/bench.yaml decode_probe.num_seqs)."""
    bench = OmegaConf.load(Path(str(importlib.resources.files("stallfree.conf"))) / "bench.yaml")
    return int(bench.decode_probe.num_seqs)


def slope(rows: pd.DataFrame, size: str) -> float:
    """Seconds per unit of ``size``: a line through the iterations' median times per size (0 with one size)."""
    medians = rows.groupby(size).iteration_s.median()
    return float(np.polyfit(medians.index.to_numpy(float), medians.to_numpy(), 1)[0]) if len(medians) > 1 else 0.0


def decode_swap_s(frame: pd.DataFrame) -> float:
    """What a decode costs over the prefill token it replaces in a hybrid of fixed size: the decode-only steps'
    slope over batch size less the prefill-only iterations' slope over tokens (up to the largest hybrid
    chunk), never below 0."""
    decodes = frame[frame.kind == "decode"]
    largest_chunk = frame[frame.kind == "hybrid"].chunk_size.max()
    prefills = frame[(frame.kind == "prefill") & (frame.prefill_tokens <= largest_chunk)]
    return max(0.0, slope(decodes, "batch_size") - slope(prefills, "prefill_tokens"))


def hybrid_tail_ms(frame: pd.DataFrame, decode_batch: int) -> pd.Series:
    """Per measured hybrid chunk size, the TAIL_QUANTILE of its iterations' times (ms), each moved to
    ``decode_batch`` decodes (``decode_swap_s`` per decode more than it held). Every measured iteration counts,
    the operator-split ones too: their hooks lengthen them a little, which errs towards a smaller chunk."""
    hybrid = frame[frame.kind == "hybrid"]
    moved = hybrid.iteration_s + (decode_batch - hybrid.decode_tokens) * decode_swap_s(frame)
    return moved.groupby(hybrid.chunk_size.astype(int)).quantile(TAIL_QUANTILE) * 1e3


@dataclass(frozen=True)
class TokenBudget:
    chunk_size: int
    predicted_ms: float  # the hybrid iteration's predicted TAIL_QUANTILE at the decode batch
    limit_ms: float  # the SLO over (1 + margin): what the prediction must not exceed


def token_budget(frame: pd.DataFrame, slo_tbt_ms: float, tile: int = DEFAULT_TILE, decode_batch: int | None = None,
                 margin: float = DEFAULT_MARGIN) -> TokenBudget | None:
    """The largest multiple of ``tile`` within the measured hybrid chunk sizes whose hybrid iteration with
    ``decode_batch`` decodes (None: ``default_decode_batch``) has a predicted P99 (``hybrid_tail_ms``,
    interpolated between the measured sizes) within ``slo_tbt_ms / (1 + margin)``; None when none fits."""
    decode_batch = default_decode_batch() if decode_batch is None else decode_batch
    tail = hybrid_tail_ms(frame, decode_batch)
    sizes, ms = tail.index.to_numpy(dtype=float), tail.to_numpy()
    limit = slo_tbt_ms / (1 + margin)
    candidates = np.arange(tile, sizes.max() + 1, tile)
    candidates = candidates[(candidates >= sizes.min()) & (candidates > decode_batch)]
    fits = [TokenBudget(int(c), float(np.interp(c, sizes, ms)), limit) for c in candidates
            if np.interp(c, sizes, ms) <= limit]
    return fits[-1] if fits else None


def budget_table(frame: pd.DataFrame, slo_tbt_ms: float | None, tile: int = DEFAULT_TILE) -> str:
    """The token budget for ``slo_tbt_ms`` (None: 5x and 25x the batch-1 decode iteration, the strict and
    relaxed SLOs of conf/slo), at the default decode batch and margin, as a Markdown table."""
    if not (frame.kind == "hybrid").any():
        return "No hybrid iterations: the token budget needs `stallfree-bench +experiment=phases`."
    if slo_tbt_ms is None:
        decode = shape_medians(frame, "decode", ["batch_size"]).set_index("batch_size").iteration_s
        base_ms = float(decode.get(1, decode.iloc[0])) * 1e3 if len(decode) else None
        slos = {} if base_ms is None else {f"strict (5x decode {base_ms:.1f} ms)": 5 * base_ms,
                                           f"relaxed (25x decode {base_ms:.1f} ms)": 25 * base_ms}
    else:
        slos = {"given": slo_tbt_ms}
    decode_batch = default_decode_batch()
    lines = [f"| TBT SLO | ms | chunk size (multiple of {tile}) | its hybrid iteration's P99 with {decode_batch} "
             f"decodes (ms) | limit: SLO / {1 + DEFAULT_MARGIN:g} (ms) |", "|---|---|---|---|---|"]
    for name, ms in slos.items():
        found = token_budget(frame, ms, tile, decode_batch)
        lines.append(f"| {name} | {ms:.1f} | " + (f"{found.chunk_size} | {found.predicted_ms:.1f} | {found.limit_ms:.1f} |"
                                                  if found else f"none fits | | {ms / (1 + DEFAULT_MARGIN):.1f} |"))
    return "\n".join(lines)


def budget_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stallfree-budget", description=(
        "The largest tile-aligned chunk size whose hybrid iteration's predicted P99 fits a TBT SLO with a margin."))
    parser.add_argument("results_dir", type=Path, help="a phases run (its phases.csv, or the directory holding it)")
    parser.add_argument("--slo-tbt-ms", type=float, required=True, help="the TBT SLO (ms), a bound on the P99 token gap")
    parser.add_argument("--tile", type=int, default=DEFAULT_TILE, help=f"tile size (tokens; default {DEFAULT_TILE})")
    parser.add_argument("--decode-batch", type=int, help="decodes beside the chunk (default: conf/bench.yaml "
                        "decode_probe.num_seqs, the batch of the SLO's decode reference)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help=f"the SLO's room beyond the predicted P99, a fraction (default {DEFAULT_MARGIN:g})")
    args = parser.parse_args(argv)
    if args.slo_tbt_ms <= 0 or args.tile < 1:
        parser.error("--slo-tbt-ms must be > 0 and --tile >= 1")
    if (args.decode_batch is not None and args.decode_batch < 1) or args.margin < 0:
        parser.error("--decode-batch must be >= 1 and --margin >= 0")
    try:
        frame = load_phases(args.results_dir)
    except FileNotFoundError as e:
        print(f"stallfree-budget: error: {e}", file=sys.stderr)
        return 2
    if not (frame.kind == "hybrid").any():
        print("stallfree-budget: error: the run has no hybrid iterations (stallfree-bench +experiment=phases)",
              file=sys.stderr)
        return 2
    decode_batch = default_decode_batch() if args.decode_batch is None else args.decode_batch
    found = token_budget(frame, args.slo_tbt_ms, args.tile, decode_batch, args.margin)
    limit = args.slo_tbt_ms / (1 + args.margin)
    if found is None:
        tail = hybrid_tail_ms(frame, decode_batch)
        print(f"no chunk size that is a multiple of {args.tile} has a hybrid iteration with {decode_batch} decodes "
              f"whose predicted P99 is within {limit:.1f} ms (the {args.slo_tbt_ms:g} ms TBT SLO with a "
              f"{args.margin:.0%} margin; {title(frame)}; the smallest measured, {tail.index[0]}, predicts "
              f"{tail.iloc[0]:.1f} ms): lower the tile or measure smaller hybrid chunks")
        return 1
    print(f"chunk_size={found.chunk_size}: its hybrid iteration with {decode_batch} decodes has a predicted P99 of "
          f"{found.predicted_ms:.1f} ms, within {found.limit_ms:.1f} ms (the {args.slo_tbt_ms:g} ms TBT SLO with a "
          f"{args.margin:.0%} margin; {title(frame)}, tile {args.tile})")
    return 0


if __name__ == "__main__":
    sys.exit(budget_main())
