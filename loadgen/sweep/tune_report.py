"""What a tune (loadgen.sweep.tune) concludes: one row per setting with its simulated and measured capacity, the
recommendation (the best *measured* setting) as a one-line answer, where the simulated and measured orders
disagree, and ``tune.md``, the answer first."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from stallfree.engine.records.capacity_bound import EXACT, UPPER
from stallfree.loadgen.sweep.tune_grid import Setting


@dataclass(frozen=True)
class TuneRow:
    setting: Setting
    own: bool  # the config's own setting (the default the answer compares with)
    simulated_rank: int | None  # 1: the highest simulated capacity; None: not simulated (tune.serve_cmd)
    simulated_capacity_qps: float | None
    simulated_display: str | None
    # measured | simulated (not confirmed live) | dropped (tune.max_minutes) | failed | skipped (tune.serve_cmd: the
    # search climbed elsewhere)
    status: str
    reason: str | None = None  # why a failed setting failed (its server did not start, or died)
    measured_capacity_qps: float | None = None
    measured_bound: str | None = None
    measured_display: str | None = None
    measured_ci_lo: float | None = None  # 95% interval over repeats (None: one repeat)
    measured_ci_hi: float | None = None
    measured_run_id: str | None = None  # the run at the measured capacity (its highest passing point)
    p99_tbt_ms: float | None = None  # of that run
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None

    @classmethod
    def failed(cls, setting: Setting, reason: str) -> TuneRow:
        return cls(setting, False, None, None, None, "failed", reason)

    @classmethod
    def skipped(cls, setting: Setting) -> TuneRow:
        return cls(setting, False, None, None, None, "skipped")

    @classmethod
    def of(cls, setting: Setting, rank: int | None, simulated: dict | None, measured: dict | None, dropped: bool,
           own: bool, read_run: Callable[[str], dict]) -> TuneRow:
        """``read_run``: a run id's summary (flat keys)."""
        sim = (setting, own, rank, simulated and simulated["capacity_qps"], simulated and simulated["capacity_display"])
        if measured is None:
            return cls(*sim, "dropped" if dropped else "simulated")
        two_or_more = len(measured["capacity_qps_repeats"]) > 1
        row = cls(*sim, "measured", None, measured["capacity_qps"], measured["capacity_bound"],
                  measured["capacity_display"], measured["capacity_ci_lo"] if two_or_more else None,
                  measured["capacity_ci_hi"] if two_or_more else None)
        best = max((p for p in measured["points"] if p["passed"]), key=lambda p: p["qps"], default=None)
        if best is None:
            return row
        run = read_run(best["run_id"])
        return replace(row, measured_run_id=best["run_id"], p99_tbt_ms=run["p99_tbt_ms"],
                       median_ttft_ms=run["median_ttft_ms"], p99_ttft_ms=run["p99_ttft_ms"])

    def as_record(self) -> dict:
        fields = asdict(self)
        return {**fields.pop("setting"), "label": self.setting.label, **fields}


def _interval(row: TuneRow) -> str:
    if row.measured_ci_lo is None or row.measured_bound != EXACT:
        return ""
    return f" ({row.measured_ci_lo:.3g}-{row.measured_ci_hi:.3g})"


def disagreements(rows: list[TuneRow]) -> list[str]:
    """Pairs of measured settings that simulation and measurement order differently (strictly, both ways)."""
    measured = [r for r in rows if r.status == "measured" and r.simulated_rank is not None]
    return [f"simulated {a.setting.label} > {b.setting.label}, measured {a.measured_display} < "
            f"{b.measured_display}"
            for a in measured for b in measured
            if a.simulated_capacity_qps > b.simulated_capacity_qps
            and a.measured_capacity_qps < b.measured_capacity_qps]


def answer(rows: list[TuneRow], tolerance: float = 0.0) -> dict:
    """The recommendation: the best measured setting (the best simulated one, flagged, where none was
    measured), its one-line answer and the disagreements between the two orders. ``tolerance``: the capacity
    search's (each capacity is a passing rate within that fraction of a failing one), under which a gain over
    the default is not told apart from it."""
    measured = [r for r in rows if r.status == "measured"]
    own = next((r for r in rows if r.own), None)
    simulated = [r for r in rows if r.simulated_rank is not None]
    if not measured and not simulated:
        return {"recommendation": None, "confirmed": False, "disagreements": [],
                "answer": "no setting was measured: every server failed (see each setting's reason)"}
    if not measured:
        best = min(simulated, key=lambda r: r.simulated_rank)
        text = (f"{best.setting.label}: simulated capacity {best.simulated_display}; NOT confirmed live "
                "(no setting was measured: raise tune.confirm or tune.max_minutes)")
        return {"recommendation": best.setting.label, "confirmed": False, "answer": text, "disagreements": []}
    best = max(measured, key=lambda r: (r.measured_capacity_qps, -(r.simulated_rank or 0)))
    if best.measured_bound == UPPER:
        text = (f"no setting met the SLO at the lowest rate tried (capacity {best.measured_display} for every "
                "measured one): relax the SLO or lower capacity.min_qps")
        return {"recommendation": None, "confirmed": True, "answer": text, "disagreements": disagreements(rows)}
    text = f"{best.setting.label}: capacity {best.measured_display}{_interval(best)}"
    if best is own:
        text += ", the config's own setting (no measured setting beat it)"
    elif own is None:
        pass  # a server tuned through its launch flags: every setting is one of the grid's
    elif own.status == "measured" and own.measured_bound != UPPER and own.measured_capacity_qps:
        gain = best.measured_capacity_qps / own.measured_capacity_qps
        text += f", {gain:.3g}x the default ({own.setting.label})"
        if gain <= 1 + tolerance:
            text += f", within the search's resolution (capacity.tolerance={tolerance:g}): not told apart from it"
    elif own.status == "measured":
        text += f"; the default ({own.setting.label}) met the SLO at no rate tried"
    return {"recommendation": best.setting.label, "confirmed": True, "answer": text,
            "disagreements": disagreements(rows)}


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


def _slo_line(slo: dict | None, repeats: int) -> str:
    if slo is None:
        return "No server started, so no SLO was resolved."
    reference = "" if slo["decode_iter_ms"] is None else (
        f", {slo['slo_reference_method']} decode reference {slo['decode_iter_ms']:.3g} ms pinned for every setting")
    return f"SLO {slo['slo_name']}: P99 TBT <= {slo['slo_tbt_ms']:.0f} ms{reference}; {repeats} repeat(s) a live search."


def tune_markdown(record: dict, rows: list[TuneRow]) -> str:
    served = "" if record["serve_cmd"] is None else f"`{record['serve_cmd']}`, "
    lines = [f"# Tune: {served}{record['model']}, workload {record['workload']}", "",
             _slo_line(record["slo"], record["repeats"]), "", f"**{record['answer']}**", ""]
    if record["live_simulated"]:
        lines += ["The live target was itself simulated (model.runner=simulated, virtual clock): nothing here was "
                  "measured on hardware.", ""]
    lines += ["| setting | simulated rank | simulated capacity | measured capacity | P50 / P99 TTFT at it (ms) "
              "| P99 TBT at it (ms) |", "|---|---|---|---|---|---|"]
    for r in rows:
        measured = (f"{r.measured_display}{_interval(r)}" if r.status == "measured"
                    else "dropped (tune.max_minutes)" if r.status == "dropped"
                    else f"failed: {r.reason}" if r.status == "failed"
                    else "not measured (the search climbed elsewhere)" if r.status == "skipped" else "not measured")
        ttft = "" if r.median_ttft_ms is None else f"{_ms(r.median_ttft_ms)} / {_ms(r.p99_ttft_ms)}"
        lines.append(f"| {r.setting.label}{' (default)' if r.own else ''} | {r.simulated_rank or ''} | "
                     f"{r.simulated_display or 'not simulated'} | {measured} | {ttft} | {_ms(r.p99_tbt_ms)} |")
    lines.append("")
    if record["disagreements"]:
        lines += ["Simulation and measurement order these settings differently:", "",
                  *[f"- {d}" for d in record["disagreements"]], ""]
    elif sum(r.status == "measured" and r.simulated_rank is not None for r in rows) > 1:
        lines += ["Simulation and measurement order the measured settings alike.", ""]
    return "\n".join(lines)
