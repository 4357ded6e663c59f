"""mode=tune (``stallfree-tune``, ``+experiment=tune``): the server setting that gives the most capacity under the
SLO, found by simulation and confirmed live.

1. The grid (loadgen.sweep.tune_grid): policy x chunk size x ``max_num_seqs`` from the ``tune`` group, the
   config's own setting always in it.
2. One SLO for every setting: resolved once on the live target, then pinned (``slo.reference_ms``), so that no
   setting is judged against a reference another engine measured.
3. Every setting's capacity searched in simulation (loadgen.sweep.capacity_search on the engine's simulated
   runner, virtual clock: seconds a setting), in experiment ``<name>-simulated``.
4. The best ``tune.confirm`` simulated settings and the config's own searched live, with the config's repeats, in
   experiment ``<name>``. With ``tune.max_minutes`` the live searches are planned from the simulated ones'
   points (their requests over their rates): the settings that do not fit are named and dropped before any runs.
5. The recommendation is the best *measured* setting; ``tune.json`` and ``tune.md`` hold it, every setting's
   simulated and measured capacity, and where the two orders disagree (loadgen.sweep.tune_report).

Every search is cached like any capacity search, so a killed tune resumes where it stopped. With
``tune.serve_cmd`` a server that is not ours is tuned live through its launch flags instead
(loadgen.sweep.tune_serve).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.records.run_summary import read_summary
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.sweep.capacity_search import run_search
from stallfree.loadgen.sweep.experiment_lock import experiment_lock
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.slo import reference_text, resolve_slo
from stallfree.loadgen.sweep.tune_grid import Setting, grid, pinned_slo, simulated, sort_key
from stallfree.loadgen.sweep.tune_report import TuneRow, answer, tune_markdown
from stallfree.loadgen.sweep.tune_serve import ServedTune


def live_seconds(record: dict, repeats: int) -> float:
    """How long a live search of the points a simulated one measured would send requests: each point's
    requests over its rate, per repeat (the drain after the last arrival not counted: a lower estimate)."""
    return repeats * sum(p["num_requests"] / p["qps"] for p in record["points"] if p["num_requests"])


def plan_live(ranked: list[tuple[Setting, dict]], own: Setting, confirm: int, repeats: int,
              max_minutes: float | None) -> tuple[list[Setting], list[Setting]]:
    """The settings measured live, the config's own first (unless it could not run), then the best simulated
    ones; and those dropped for ``max_minutes``."""
    wanted = [s for s, _ in ranked if s == own] + [s for s, _ in ranked if s != own][:confirm]
    if max_minutes is None:
        return wanted, []
    estimate = {s: live_seconds(record, repeats) for s, record in ranked}
    kept, dropped, total = [], [], 0.0
    for setting in wanted:
        if total + estimate[setting] <= 60 * max_minutes:
            kept.append(setting)
            total += estimate[setting]
        else:
            dropped.append(setting)
    return kept, dropped


def run_tune(cfg: BenchConfig, targets: LiveTarget) -> dict:
    """Tune ``cfg``'s server settings (see the module docstring); the tune record."""
    tune = cfg.tune
    assert tune is not None  # BenchConfig requires it for mode=tune
    exp_dir = Path(cfg.results_dir) / cfg.experiment_name
    if tune.serve_cmd is not None:
        return run_served_tune(cfg, targets, exp_dir)
    slo = resolve_slo(cfg, exp_dir, targets)
    base = pinned_slo(cfg, slo["decode_iter_ms"])
    settings, own = grid(cfg, tune), Setting.of(cfg)
    print(f"[tune] {len(settings)} settings, slo={cfg.slo.name} ({slo['slo_tbt_ms']:.0f} ms, {reference_text(slo)}, "
          "pinned for every setting): searching each in simulation", flush=True)
    searched, failed = {}, {}
    for setting in settings:
        try:
            searched[setting] = run_search(simulated(setting.apply(base), tune), targets)
        except ConfigError as e:  # a setting the engine refuses (vllm's budget under max_model_len): a row
            failed[setting] = str(e)
            print(f"[tune] {setting.label} cannot run: {e}", flush=True)
    if not searched:
        raise ConfigError(next(iter(failed.values())))  # the config's, not a setting's
    ranked = sorted(searched.items(), key=lambda item: (-item[1]["capacity_qps"], sort_key(item[0])))
    live, dropped = plan_live(ranked, own, tune.confirm, cfg.repeats, tune.max_minutes)
    if dropped:
        print(f"[tune] tune.max_minutes={tune.max_minutes:g}: {len(live)} of {len(live) + len(dropped)} live searches "
              f"fit; dropped: {'; '.join(s.label for s in dropped)}", flush=True)
    measured = {}
    for setting in live:
        print(f"[tune] live: {setting.label}", flush=True)
        measured[setting] = run_search(setting.apply(base), targets)
    rows = [TuneRow.of(setting, rank, record, measured.get(setting), setting in dropped, setting == own,
                       run_reader(exp_dir))
            for rank, (setting, record) in enumerate(ranked, start=1)]
    rows += [TuneRow.failed(setting, reason) for setting, reason in failed.items()]
    return _conclude(cfg, exp_dir, slo, rows)


def run_served_tune(cfg: BenchConfig, targets: LiveTarget, exp_dir: Path) -> dict:
    """A server that is not ours, tuned live through ``tune.serve_cmd`` (loadgen.sweep.tune_serve)."""
    served = ServedTune(cfg, targets)
    print(f"[tune] {cfg.tune.serve_cmd}: {len(served.chunks) * len(served.seqs)} settings, searched live, coarse "
          "first, then around the best", flush=True)
    served.run()
    read_run = run_reader(exp_dir)
    rows = [*(TuneRow.of(served.setting(c), None, None, record, False, False, read_run)
              for c, record in served.measured.items()),
            *(TuneRow.failed(served.setting(c), reason) for c, reason in served.failed.items()),
            *(TuneRow.of(served.setting(c), None, None, None, True, False, read_run) for c in served.dropped),
            *(TuneRow.skipped(served.setting(c)) for c in served.untried())]
    return _conclude(cfg, exp_dir, served.slo, sorted(rows, key=lambda r: sort_key(r.setting)))


def run_reader(exp_dir: Path) -> Callable[[str], dict]:
    def read_run(run_id: str) -> dict:
        return read_summary(exp_dir / run_id / "summary.json").flat()

    return read_run


def _conclude(cfg: BenchConfig, exp_dir: Path, slo: dict | None, rows: list[TuneRow]) -> dict:
    record = {"slo": slo, "model": cfg.target.served_model or cfg.model.model, "workload": cfg.workload.name, "repeats": cfg.repeats,
              "live_target": cfg.target.kind, "live_simulated": cfg.virtual_time, "serve_cmd": cfg.tune.serve_cmd,
              "settings": [row.as_record() for row in rows], **answer(rows, cfg.capacity.tolerance)}
    _write(exp_dir, record, tune_markdown(record, rows))
    print(f"[tune] {record['answer']}", flush=True)
    return record


def _write(exp_dir: Path, record: dict, markdown: str) -> None:
    with experiment_lock(exp_dir):
        exp_dir.mkdir(parents=True, exist_ok=True)
        (exp_dir / "tune.json").write_text(json.dumps(record, indent=2) + "\n")
        (exp_dir / "tune.md").write_text(markdown)
