"""Per-request metrics and the run summary, with vLLM benchmark key names.

The one definition of every latency, used by the run summary here and by analysis/ alike: ``ttft`` and
``e2el`` count from the intended send time (the open-loop schedule), ``ttft_from_send`` and
``e2el_from_send`` from the actual send (vLLM's definitions); a request's end-to-end latency runs to
its ``finish_time``, when its response ended (as vLLM's e2el does), not to its last token.

Input is a DataFrame with the requests.parquet columns (stallfree.engine.records.RequestRecord). Warm-up rows
are left out of the summary; failed rows (status != ok) are left out of latency statistics but counted
in ``failed``. Times in the input are epoch seconds; every ``*_ms`` output is milliseconds.

Whether the server kept pace with the offered load (``pace_summary``), judged from what any target
shows a client: over the steady window (the requests between the 10% and 90% quantiles, leaving out
the ramp-up and the drain) the completion rate against the offered rate, the peak number of requests
in flight, and a client-side scheduling delay, TTFT minus the TTFT of the same prompt sent alone
(``UnloadedTtft``), with its growth over the run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stallfree.engine.records import BatchRecord
from stallfree.engine.records.client_pace import client_pace
from stallfree.engine.records.kv_transfer_metrics import kv_transfer_summary
from stallfree.engine.records.quantile_bounds import p99_tbt_evidence
from stallfree.engine.records.session_metrics import session_summary

PERCENTILES = {"median": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}
LATENCY_METRICS = ("ttft", "ttft_from_send", "tpot", "itl", "tbt", "e2el", "e2el_from_send",
                   "normalized_latency", "scheduling_delay")
# vLLM's --goodput SLOs (ms) -> the per-request metric each bounds (vLLM's definitions: from the send)
GOODPUT_METRICS = {"ttft": "ttft_from_send_ms", "tpot": "tpot_ms", "e2el": "e2el_from_send_ms"}
TIME_COLUMNS = ("intended_send_time", "send_time", "first_token_time", "finish_time",
                "server_arrival_time", "server_first_scheduled_time")
STEADY_QUANTILES = (0.1, 0.9)  # the steady window of a run's arrivals and completions


@dataclass(frozen=True)
class UnloadedTtft:
    """The TTFT of a request sent alone, linear in its prompt length (loadgen.sweep.unloaded_ttft measures it)."""

    intercept_ms: float
    per_prompt_token_ms: float

    def at(self, prompt_tokens: float | pd.Series) -> float | pd.Series:
        return self.intercept_ms + self.per_prompt_token_ms * prompt_tokens


def _gaps_ms(token_times) -> np.ndarray:
    if token_times is None:
        return np.empty(0)
    return np.diff(np.asarray(token_times, dtype=float)) * 1e3


def request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """Every row plus per-request metric columns (ms; NaN where not defined, and for failed requests).

    ``tbt_ms`` holds each request's gaps between consecutive tokens (an array); the scalar columns
    are ttft_ms (first token - intended send), ttft_from_send_ms (first token - actual send),
    e2el_ms (finish - intended send), e2el_from_send_ms (finish - actual send), tpot_ms ((e2el - ttft) / (output_tokens - 1), only for > 1
    output token), normalized_latency_ms (e2el / output_tokens), scheduling_delay_ms (server first
    scheduled - server arrival), max_tbt_ms, schedule_lag_ms (actual - intended send; defined
    for failed requests too) and client_wait_ms (the part of the lag spent waiting for a slot under
    ``arrival.max_concurrency``; NaN without a cap).
    """
    df = requests.copy()
    for col in TIME_COLUMNS:
        df[col] = df[col].astype(float)
    ok = df["status"] == "ok"
    out = df["output_tokens"].astype(float)
    df["schedule_lag_ms"] = (df["send_time"] - df["intended_send_time"]) * 1e3
    waits = df["client_wait_s"] if "client_wait_s" in df else pd.Series(np.nan, index=df.index)
    df["client_wait_ms"] = waits.astype(float) * 1e3
    df["ttft_ms"] = ((df["first_token_time"] - df["intended_send_time"]) * 1e3).where(ok)
    df["ttft_from_send_ms"] = ((df["first_token_time"] - df["send_time"]) * 1e3).where(ok)
    df["e2el_ms"] = ((df["finish_time"] - df["intended_send_time"]) * 1e3).where(ok)
    df["e2el_from_send_ms"] = ((df["finish_time"] - df["send_time"]) * 1e3).where(ok)
    df["tpot_ms"] = ((df["e2el_ms"] - df["ttft_ms"]) / (out - 1)).where(out > 1)
    df["normalized_latency_ms"] = (df["e2el_ms"] / out).where(out > 0)
    df["scheduling_delay_ms"] = ((df["server_first_scheduled_time"] - df["server_arrival_time"])
                                 * 1e3).where(ok)
    df["tbt_ms"] = [_gaps_ms(t) if good else np.empty(0) for t, good in zip(df["token_times"], ok, strict=True)]
    df["max_tbt_ms"] = [g.max() if len(g) else np.nan for g in df["tbt_ms"]]
    return df


def per_request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """``request_metrics`` of the non-warm-up rows: the requests a summary measures."""
    return request_metrics(requests[~requests["is_warmup"].astype(bool)])


def _stats(name: str, values) -> dict[str, float | None]:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    keys = [f"{stat}_{name}_ms" for stat in ("mean", "std", *PERCENTILES)]
    if not len(v):
        return dict.fromkeys(keys)
    vals = [v.mean(), v.std(), *np.percentile(v, list(PERCENTILES.values()))]
    return {k: float(x) for k, x in zip(keys, vals, strict=True)}


def _per_second(count: float, duration: float | None) -> float | None:
    return float(count / duration) if duration else None


def parse_goodput(spec: str | None) -> dict[str, float]:
    """vLLM's goodput SLOs, ``"ttft:500 tpot:50 e2el:2000"`` (ms; any of the three) -> a dict."""
    slos = {}
    for item in (spec or "").replace(",", " ").split():
        name, _, value = item.partition(":")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"slo.goodput must be KEY:MS items, got {item!r}") from None
        if name not in GOODPUT_METRICS or slos[name] <= 0:
            raise ValueError(f"slo.goodput keys are {sorted(GOODPUT_METRICS)} with values > 0, got {item!r}")
    return slos


def _steady_rate(times: pd.Series) -> float | None:
    """Requests per second between the STEADY_QUANTILES of ``times`` (None when they coincide)."""
    lo, hi = STEADY_QUANTILES
    times = times.dropna()
    span = float(times.quantile(hi) - times.quantile(lo)) if len(times) > 1 else 0.0
    return (hi - lo) * len(times) / span if span > 0 else None


def _steady_window(sends: pd.Series) -> tuple[float, float]:
    lo, hi = (float(q) for q in sends.quantile(list(STEADY_QUANTILES)))
    return lo, hi


# How completion_ratio is counted; a cached capacity point counted another way is measured again
COMPLETION_METHOD = ("ended ok per second in the steady window, each edge shifted by the median latency of the "
                     "window's third there / the window's offered rate")


def _steady_completion(df: pd.DataFrame, ok: pd.DataFrame, lo: float, hi: float) -> tuple[float | None, float | None]:
    """(completion rate, completion ratio) of the steady window: the requests that ended ok, whichever they
    were, per second of the window with its start shifted by the median latency of its first third of
    requests and its end by that of its last third, and that rate over the window's offered rate, at most 1.
    A server that keeps pace ends requests as fast as they arrive, however its latencies spread: a burst of
    arrivals at one edge, whose requests wait longer, moves that edge with them (one shift for both edges
    counted their late finishes as missing). One that falls behind ends them at its service rate, however
    far its latencies have grown. Where the shifted edges cross (latency falling faster than time passes),
    both move by the window's median latency. Rating the finishes by their own quantile span instead
    overstates a burst the server absorbed at once, whose requests all finish together."""
    if df["intended_send_time"].count() < 2:
        return None, None
    window = df[df["intended_send_time"].between(lo, hi)]
    done = ok[ok["intended_send_time"].between(lo, hi)].sort_values("intended_send_time", kind="stable")
    if hi <= lo or window.empty or done.empty:
        return None, None
    latency = (done["finish_time"] - done["intended_send_time"]).to_numpy()
    third = max(1, len(latency) // 3)
    start, end = lo + float(np.median(latency[:third])), hi + float(np.median(latency[-third:]))
    if end <= start:
        start, end = lo + float(np.median(latency)), hi + float(np.median(latency))
    rate = int(ok["finish_time"].between(start, end).sum()) / (end - start)
    return rate, min(1.0, rate / (len(window) / (hi - lo)))


def peak_in_flight(send: pd.Series, finish: pd.Series) -> int:
    """The most requests sent and not yet ended at any one time (a request ends at its finish time, before one
    sent at that time: a slot a cap refills at once holds one request)."""
    sent = send.notna()
    events = pd.concat([pd.Series(-1, index=finish[sent].to_numpy()), pd.Series(1, index=send[sent].to_numpy())])
    return int(events.sort_index(kind="stable").cumsum().max()) if len(events) else 0


def pace_summary(df: pd.DataFrame, unloaded: UnloadedTtft | None = None) -> dict:
    """Whether the server kept pace (``per_request_metrics`` rows): ``steady_offered_rate`` (requests/s
    between the STEADY_QUANTILES of the intended sends: the steady window), ``steady_completion_rate`` (the
    requests that ended ok per second of the window with each edge shifted by the latency there: a server
    that keeps pace ends them as fast as they arrived) and ``completion_ratio`` (that over the window's
    offered rate, at most 1, however the finishes bunch up); ``peak_in_flight``; ``arrival_window_s`` (last - first intended send). With ``unloaded``:
    the client-side scheduling delay of each ok request (TTFT - unloaded TTFT of its prompt length), its
    median ``median_client_scheduling_delay_ms`` and ``client_scheduling_delay_growth_ms``: the median over
    the last third of the steady window's requests (by intended send) minus the median over its first
    third, positive when a queue builds up."""
    ok = df[df["status"] == "ok"]
    sends = df["intended_send_time"]
    lo, hi = _steady_window(sends)
    offered, (completed, ratio) = _steady_rate(sends), _steady_completion(df, ok, lo, hi)
    out = {"steady_offered_rate": offered, "steady_completion_rate": completed, "completion_ratio": ratio,
           "completion_method": COMPLETION_METHOD,
           "peak_in_flight": peak_in_flight(df["send_time"], df["finish_time"]),
           "arrival_window_s": float(sends.max() - sends.min()) if len(df) else None,
           "median_client_scheduling_delay_ms": None, "client_scheduling_delay_growth_ms": None}
    if unloaded is None or ok.empty:
        return out
    delay = ok["ttft_ms"] - unloaded.at(ok["prompt_tokens"].astype(float))
    in_window = ok["intended_send_time"].between(lo, hi)
    steady = (ok.assign(delay=delay)[in_window].sort_values("intended_send_time", kind="stable")["delay"]
              .to_numpy())
    third = len(steady) // 3
    out["median_client_scheduling_delay_ms"] = float(np.median(delay))
    if third:
        out["client_scheduling_delay_growth_ms"] = float(np.median(steady[-third:]) - np.median(steady[:third]))
    return out


def summarize(requests: pd.DataFrame, slo_tbt_ms: float | None = None, slo_ttft_ms: float | None = None,
              slo_e2e_ms: float | None = None, goodput: str | None = None,
              unloaded_ttft: UnloadedTtft | None = None) -> dict:
    """The run summary: counts, throughput, goodput, latency statistics and validity flags.

    duration = last finish - first intended send (all non-warm-up rows). A request is good when it
    is ok and meets every given SLO: ttft <= slo_ttft_ms, e2el <= slo_e2e_ms and every one of its
    token gaps <= slo_tbt_ms. ``request_goodput_vllm`` counts the ok requests that meet every SLO of
    ``goodput`` (vLLM's ``--goodput``, see parse_goodput) with vLLM's definitions (from the actual
    send; a 1-token request meets any tpot). Offered / achieved rates are (n - 1) / span of the
    intended / actual send times, so a constant-rate schedule reports exactly its qps. The fields of
    ``pace_summary`` (with ``unloaded_ttft``, the client-side scheduling delay) follow.
    """
    df = per_request_metrics(requests)
    ok = df["status"] == "ok"
    done = df[ok]
    finish = df["finish_time"].max()
    duration = float(finish - df["intended_send_time"].min()) if len(df) and not np.isnan(finish) else None
    total_in = int(done["prompt_tokens"].sum())
    total_out = int(done["output_tokens"].sum())

    good = ok.copy()
    if slo_ttft_ms is not None:
        good &= df["ttft_ms"] <= slo_ttft_ms
    if slo_e2e_ms is not None:
        good &= df["e2el_ms"] <= slo_e2e_ms
    if slo_tbt_ms is not None:
        good &= df["max_tbt_ms"].fillna(0.0) <= slo_tbt_ms  # a 1-token request has no gaps

    vllm_slos = parse_goodput(goodput)
    vllm_good = ok.copy()
    for name, bound in vllm_slos.items():
        vllm_good &= df[GOODPUT_METRICS[name]].fillna(0.0) <= bound

    tbt = np.concatenate([np.empty(0), *done["tbt_ms"]])
    per_metric = {"ttft": done["ttft_ms"], "ttft_from_send": done["ttft_from_send_ms"],
                  "tpot": done["tpot_ms"], "itl": tbt, "tbt": tbt, "e2el": done["e2el_ms"],
                  "e2el_from_send": done["e2el_from_send_ms"],
                  "normalized_latency": done["normalized_latency_ms"],
                  "scheduling_delay": done["scheduling_delay_ms"]}

    summary = {
        "completed": int(ok.sum()),
        "failed": int((~ok).sum()),
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": _per_second(int(ok.sum()), duration),
        "output_throughput": _per_second(total_out, duration),
        "total_token_throughput": _per_second(total_in + total_out, duration),
        "request_goodput": _per_second(int(good.sum()), duration),
        "request_goodput_vllm": _per_second(int(vllm_good.sum()), duration) if vllm_slos else None,
    }
    for name in LATENCY_METRICS:
        summary.update(_stats(name, per_metric[name]))
    summary.update({
        **client_pace(df),
        **pace_summary(df, unloaded_ttft),
        **session_summary(df),
        **kv_transfer_summary(df),
        **p99_tbt_evidence(tbt, len(done)),
        "slo_tbt_ms": slo_tbt_ms,
        "slo_ttft_ms": slo_ttft_ms,
        "slo_e2e_ms": slo_e2e_ms,
        "slo_goodput": " ".join(f"{k}:{v:g}" for k, v in vllm_slos.items()) or None,
    })
    return summary


def pipeline_summary(batches: list[BatchRecord] | None) -> dict:
    """A simulated deployment's pipeline stages over a run (BatchRecord ``stage_busy_s`` / ``stage_idle_s``):
    ``pipeline_bubble_fraction``, the share of the stages' time spent idle while the engine had work (None for
    runs without stage records), and ``pipeline_stages``."""
    staged_batches = [batch for batch in batches or () if batch.stage_busy_s]
    if not staged_batches:
        return {"pipeline_bubble_fraction": None, "pipeline_stages": None}
    busy = sum(sum(batch.stage_busy_s) for batch in staged_batches)
    idle = sum(sum(batch.stage_idle_s) for batch in staged_batches)
    return {"pipeline_bubble_fraction": idle / (busy + idle) if busy + idle > 0 else 0.0,
            "pipeline_stages": len(staged_batches[0].stage_busy_s)}
