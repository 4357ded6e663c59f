"""Load stallfree results (layout in docs/results.md) into tidy DataFrames.

A *source* is a results root (`results/`), one experiment dir (`results/<exp>/`), one run dir, a vLLM
`bench serve --save-result` JSON file (`stallfree.analysis.vllm_format`), a list of those, or a runs DataFrame from
`load_runs` (then its `run_dir` column is used). Runs come from
each run's `summary.json`; an experiment without run dirs falls back to its `summary.parquet` (such
runs have no requests or batches). Dot-prefixed and `*.tmp` dirs are runs still being written and
are skipped. Every frame carries the run keys `RUN_KEYS`, so frames join on them.

Per-request latencies are loadgen's own (`stallfree.engine.records.request_metrics.request_metrics`), so they agree with the
run summaries. Whether a run's policy chunks prefills is read from the data: its summary's `chunk_size`
is null for a policy that does not chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from stallfree.analysis.vllm_format import read_vllm_results
from stallfree.engine.records.batch_rows import BATCH_COLUMNS, read_batches
from stallfree.engine.records.policies import POLICIES
from stallfree.engine.records.request_metrics import request_metrics
from stallfree.engine.records.run_summary import read_summary

RUN_KEYS = ["experiment", "run_id", "scheduler", "chunk_size", "qps"]
METRIC_COLUMNS = ["output_throughput", "p99_tbt_ms", "median_ttft_ms", "p99_ttft_ms",
                  "median_scheduling_delay_ms", "slo_tbt_ms", "slo_ttft_ms", "decode_iter_ms"]
DERIVED_BATCH_COLUMNS = ("iteration_ms", "num_tokens", "kind", "decode_stall")  # load_batches adds them
NO_CHUNK = "none"
PREFIX_SUFFIX = "+prefix"  # a config label's mark of an engine that cached prefixes

Source = str | Path | Iterable[str | Path] | pd.DataFrame


def run_dirs(path: str | Path) -> list[Path]:
    """Complete run dirs (holding summary.json) at, or one or two levels below, `path`."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"results directory not found: {path}")
    found = {p.parent for pattern in ("summary.json", "*/summary.json", "*/*/summary.json")
             for p in path.glob(pattern)}
    return sorted(d for d in found if not (d.name.startswith(".") or d.name.endswith(".tmp")))


def load_runs(source: Source) -> pd.DataFrame:
    """One row per run: every summary.json key (at least `METRIC_COLUMNS`, NaN when absent), plus
    `run_dir` and the `chunk` / `config` labels.

    `chunk_size` is NA for runs of a policy that does not chunk (the bench records null there), and
    `chunk` is then "none". `config` is e.g. "vllm",
    "sarathi-512". Rows are ordered by experiment, policy (`POLICIES` order), chunk size, QPS.
    """
    if isinstance(source, pd.DataFrame):
        return source
    records: list[dict] = []
    fallbacks: list[pd.DataFrame] = []
    vllm_files = [p for p in _paths(source) if p.suffix == ".json" and p.is_file()]
    if vllm_files:
        fallbacks.append(read_vllm_results(vllm_files))
    for path in _paths(source):
        if path in vllm_files:
            continue
        dirs = run_dirs(path)
        for d in dirs:
            record = read_summary(d / "summary.json").flat()
            records.append({**record, "experiment": record["experiment"] or d.parent.name,
                            "run_id": record["run_id"] or d.name, "run_dir": str(d)})
        covered = {d.parent for d in dirs}
        fallbacks += [pd.read_parquet(p).assign(run_dir=None)
                      for pattern in ("summary.parquet", "*/summary.parquet")
                      for p in sorted(path.glob(pattern)) if p.parent not in covered]
    runs = pd.concat([pd.DataFrame.from_records(records), *fallbacks], ignore_index=True)
    columns = dict.fromkeys([*RUN_KEYS, *runs.columns, *METRIC_COLUMNS, "run_dir"])
    return _tidy_runs(runs.reindex(columns=list(columns)))


def load_requests(source: Source, measured_only: bool = True) -> pd.DataFrame:
    """One row per request (requests.parquet) with run keys and loadgen's per-request metrics
    (`stallfree.engine.records.request_metrics.request_metrics`, all in ms, NaN for failed requests): `ttft_ms` (first token -
    intended send), `e2el_ms` (finish - intended send; also as `e2e_ms`), `tpot_ms` ((e2el - ttft) /
    (output_tokens - 1), NaN below 2 tokens), `scheduling_delay_ms` (server first scheduled - server
    arrival), and the others of that function. `measured_only` keeps status "ok", non-warmup requests.
    """
    requests = _per_run(source, "requests.parquet")
    if requests.empty:
        return requests.reindex(columns=[*RUN_KEYS, "request_id", "ttft_ms", "e2el_ms", "e2e_ms", "tpot_ms"])
    if measured_only:
        requests = requests[(requests["status"] == "ok") & ~requests["is_warmup"].astype(bool)]
    metrics = request_metrics(requests)
    return metrics.assign(e2e_ms=metrics["e2el_ms"]).reset_index(drop=True)


def token_gaps(requests: pd.DataFrame, times: str = "token_times") -> pd.DataFrame:
    """Long TBT frame: one row per gap between consecutive tokens of a request.

    Columns: run keys, `request_id`, `token_index` (index of the later token, from 1), `time` (epoch
    s of the later token), `tbt_ms`. `times` picks client (`token_times`) or `server_token_times`.
    """
    columns = [*RUN_KEYS, "request_id"]
    series = requests[times] if times in requests else pd.Series([], dtype=object)
    arrays = [np.asarray([] if ts is None else ts, dtype=float) for ts in series]
    lengths = np.array([len(a) for a in arrays], dtype=int)
    flat = np.concatenate(arrays) if arrays else np.array([], dtype=float)
    position = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    keep = position > 0
    gaps = requests.iloc[np.repeat(np.arange(len(arrays)), lengths)[keep]].reindex(columns=columns)
    return gaps.reset_index(drop=True).assign(
        token_index=position[keep], time=flat[keep], tbt_ms=np.diff(flat, prepend=np.nan)[keep] * 1000.0)


def load_batches(source: Source) -> pd.DataFrame:
    """One row per engine iteration (batches.parquet) with run keys and derived columns:

    `iteration_ms`, `num_tokens`, `kind` ("prefill" / "decode" / "hybrid": which tokens the
    iteration ran) and `decode_stall`: a prefill-only iteration while other requests were running,
    i.e. `num_running > num_prefill_seqs` -- those requests got no token this iteration.
    """
    batches = _per_run(source, "batches.parquet", read_batches)
    if batches.empty:
        return batches.reindex(columns=[*RUN_KEYS, *BATCH_COLUMNS, *DERIVED_BATCH_COLUMNS])
    prefill = batches["num_prefill_tokens"] > 0
    decode = batches["num_decode_tokens"] > 0
    kind = np.select([prefill & decode, prefill], ["hybrid", "prefill"], "decode")
    return batches.assign(
        iteration_ms=(batches["end_time"] - batches["start_time"]) * 1000.0,
        num_tokens=batches["num_prefill_tokens"] + batches["num_decode_tokens"],
        kind=kind,
        decode_stall=(kind == "prefill") & (batches["num_running"] > batches["num_prefill_seqs"]),
    )


def load_server_metrics(source: Source) -> pd.DataFrame:
    """One row per metric of each scrape of the server's /metrics (server_metrics.parquet: `time`,
    `metric` in loadgen's vocabulary, e.g. `requests_waiting`, `value`, `series`: the engine's own name),
    with run keys; runs without the file (target=inprocess) have no rows."""
    server = _per_run(source, "server_metrics.parquet")
    return server.reindex(columns=[*RUN_KEYS, "time", "metric", "value", "series"]) if server.empty else server


def coverage_note(runs: pd.DataFrame) -> str:
    """Markdown line: runs per config, and what the loaded results lack."""
    if runs.empty:
        return "**No runs found** -- run `stallfree-bench` first; the figures below are empty."
    counts = runs.groupby("config", sort=False).size()
    notes = [f"{len(runs)} runs ({', '.join(f'{config}: {n}' for config, n in counts.items())})."]
    policies = set(runs["scheduler"])
    missing = [p for p in POLICIES if p not in policies]
    if missing and policies & set(POLICIES):  # runs of servers elsewhere (labels, not policies) miss none
        notes.append(f"No runs for policies: {', '.join(missing)}.")
    disturbed = runs.loc[disturbed_mask(runs), "run_id"]
    if len(disturbed):
        notes.append("**Disturbed runs** (the engine, or a url run's load generator, got too little of the CPU it "
                     "asked for; drawn hollow): "
                     f"{', '.join(disturbed.astype(str))}.")
    experiments = sorted(runs["experiment"].astype(str).unique())
    if len(experiments) > 1:
        notes.append(f"Runs of {len(experiments)} experiments are pooled ({', '.join(experiments)}); "
                     "pass one experiment dir to compare within one.")
    return " ".join(notes)


def disturbed_mask(runs: pd.DataFrame) -> pd.Series:
    """Runs marked disturbed (summary `disturbed`; false where unknown)."""
    if "disturbed" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["disturbed"].astype(object).where(runs["disturbed"].notna(), False).astype(bool)


def label_configs(frame: pd.DataFrame) -> pd.DataFrame:
    """Types `chunk_size` (NA: the policy does not chunk) and adds the `chunk` / `config` labels; an engine that
    cached prefixes (`prefix_caching` true) is `<config>+prefix`."""
    chunk_size = pd.to_numeric(frame["chunk_size"]).astype("Int64")
    chunked = chunk_size.notna()
    chunk = chunk_size.astype("string").fillna(NO_CHUNK).astype(str)
    config = frame["scheduler"].astype(str) + ("-" + chunk).where(chunked, "")
    if "prefix_caching" in frame:
        config = config + pd.Series(PREFIX_SUFFIX, index=frame.index).where(frame["prefix_caching"].eq(True), "")
    return frame.assign(chunk_size=chunk_size, chunk=chunk, config=config)


def engine_labels(frame: pd.DataFrame) -> pd.Series:
    """The engine of each run or capacity record (a frame with `target`, `scheduler`, `chunk_size`): a server
    the bench did not start (`target` "url") is the label its runs carry in `scheduler`; stallfree is
    "stallfree <policy>[-<chunk size>]"."""
    external = frame["target"].eq("url") if "target" in frame else pd.Series(False, index=frame.index)
    return frame["scheduler"].astype(str).where(external, "stallfree " + label_configs(frame)["config"])


def _paths(source: str | Path | Iterable[str | Path]) -> list[Path]:
    return [Path(source)] if isinstance(source, str | Path) else [Path(p) for p in source]


def _tidy_runs(runs: pd.DataFrame) -> pd.DataFrame:
    order = runs["scheduler"].map({p: i for i, p in enumerate(POLICIES)}).fillna(len(POLICIES))
    return (label_configs(runs).assign(qps=pd.to_numeric(runs["qps"]).astype(float), _order=order)
            .sort_values(["experiment", "_order", "scheduler", "chunk_size", "qps"], na_position="first")
            .drop(columns="_order").reset_index(drop=True))


def _per_run(source: Source, filename: str,
             read: Callable[[Path], pd.DataFrame] = pd.read_parquet) -> pd.DataFrame:
    """Concatenates `filename` of every run that has one (as `read` reads it), each row tagged with its run keys."""
    frames = [read(Path(run["run_dir"]) / filename).assign(**{k: run[k] for k in RUN_KEYS})
              for run in load_runs(source).to_dict("records")
              if isinstance(run["run_dir"], str) and (Path(run["run_dir"]) / filename).is_file()]
    if not frames:
        return pd.DataFrame(columns=RUN_KEYS)
    return pd.concat(frames, ignore_index=True).astype({"chunk_size": "Int64", "qps": float})
