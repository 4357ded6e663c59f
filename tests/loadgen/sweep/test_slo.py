"""The SLO's decode reference: pinned, from a cost model, or probed robustly (a low quantile, two
measurements that must agree, a disturbed reference flagged), once per experiment."""

import json

import pytest
from hydra import compose, initialize_config_dir

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.records import RequestRecord
from stallfree.loadgen.config.checks import CONF_DIR
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep.slo import decode_steps_ms, resolve_slo
from stallfree.loadgen.targets.base import Replay
from tests.helpers.paths import ROOT

COST_MODEL = ROOT / "engine" / "simulator" / "fitting" / "cost_models" / "small-cpu.json"


def config(*overrides: str):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return load_bench(compose("bench", ["model=tiny", *overrides]))


class StepTarget:
    """A stand-in target (the probe's arithmetic is under test, not an engine): every burst decodes at
    the next of ``step_ms``, with one slow outlier step per request."""

    vocab_size, engine_pid = 2048, None

    def __init__(self, step_ms: list[float]):
        self.step_ms, self.bursts = list(step_ms), 0

    def replay(self, specs, *, warmup, progress):
        step = self.step_ms[min(self.bursts, len(self.step_ms) - 1)] / 1e3
        self.bursts += 1
        records = []
        for spec in specs:
            record = RequestRecord.unsent(spec, intended_send_time=0.0, is_warmup=False)
            record.mark_sent(0.0)
            times = [i * step for i in range(spec.max_tokens)]
            times[-1] += 50 * step  # an outlier: the low quantile ignores it
            record.server_token_times = times
            record.end("ok", None, times[-1])
            records.append(record)
        return Replay(records, None)


class Targets:
    def __init__(self, target):
        self.target, self.gets = target, 0

    def get(self, cfg, log_dir):
        self.gets += 1
        return self.target


def test_client_times_give_each_requests_mean_gap():
    record = RequestRecord(request_id="r", status="ok", error=None, is_warmup=False, prompt_tokens=1, max_tokens=3,
                           output_tokens=3, intended_send_time=0.0, send_time=0.0, first_token_time=0.0,
                           finish_time=0.01, token_times=[0.0, 0.0, 0.010])  # the first two tokens came bunched
    assert decode_steps_ms([record]) == [5.0]


def test_a_clean_probe_is_cached_with_its_method(tmp_path):
    cfg = config("slo=relaxed")
    targets = Targets(StepTarget([10.0]))
    slo = resolve_slo(cfg, tmp_path, targets)
    assert abs(slo["decode_iter_ms"] - 10.0) < 1e-6 and abs(slo["slo_tbt_ms"] - 250.0) < 1e-4
    assert slo["slo_reference_method"] == "probe" and slo["slo_reference_disturbed"] is False
    bursts = targets.target.bursts
    assert bursts == 1 + 2 * cfg.decode_probe.rounds  # a warm-up, then two measurements
    assert resolve_slo(cfg, tmp_path, targets) == slo and targets.target.bursts == bursts  # cached


def test_measurements_that_disagree_are_retried_flagged_and_kept_for_the_experiment(tmp_path, monkeypatch):
    """One SLO per experiment: a disturbed reference is flagged and every later run uses it, until
    rerun=disturbed measures it again (once per process)."""
    from stallfree.loadgen.sweep import slo as slo_module

    cfg = config("decode_probe.rounds=1", "decode_probe.attempts=2")
    # warm-up, then attempts (10, 20) and (10, 30): neither within max_spread
    slo = resolve_slo(cfg, tmp_path, Targets(StepTarget([99.0, 10.0, 20.0, 10.0, 30.0])))
    assert slo["slo_reference_disturbed"] is True and abs(slo["decode_iter_ms"] - 15.0) < 1e-6
    assert slo["slo_reference_spread"] == 1.0 and slo["slo_reference_measurements_ms"] == [10.0, 20.0]
    monkeypatch.setattr(slo_module, "_probed_here", set())  # a later process of the same experiment
    unused = Targets(StepTarget([10.0]))
    assert resolve_slo(cfg, tmp_path, unused) == slo and unused.gets == 0
    again = config("decode_probe.rounds=1", "decode_probe.attempts=2", "rerun=disturbed")
    remeasured = resolve_slo(again, tmp_path, Targets(StepTarget([99.0, 10.0, 10.5])))
    assert remeasured["slo_reference_disturbed"] is False and abs(remeasured["decode_iter_ms"] - 10.25) < 1e-6
    assert resolve_slo(again, tmp_path, unused) == remeasured and unused.gets == 0  # once per process


def test_a_pinned_or_modelled_reference_runs_no_probe(tmp_path):
    targets = Targets(StepTarget([10.0]))
    pinned = resolve_slo(config("slo=strict", "slo.reference_ms=20"), tmp_path, targets)
    assert (pinned["slo_tbt_ms"], pinned["slo_reference_method"]) == (100.0, "pinned")
    modelled = resolve_slo(config(f"slo.reference_cost_model={COST_MODEL}"), tmp_path, targets)
    assert modelled["slo_reference_method"] == "cost_model" and 1 < modelled["decode_iter_ms"] < 1000
    assert targets.gets == 0
    absolute = resolve_slo(config("slo.tbt_ms=300"), tmp_path, targets)
    assert (absolute["slo_tbt_ms"], absolute["slo_reference_method"]) == (300.0, "absolute")


def test_a_running_server_is_labelled_by_what_it_says_or_its_label_not_bench_defaults():
    from stallfree.engine.server import start_server
    from stallfree.loadgen.sweep.plan import plan_run

    with start_server({"model": "tiny", "dtype": "float32"}) as server:
        plan = plan_run(config("target=url", f"target.url={server.url}", "scheduler=sarathi", "scheduler.chunk_size=512"))
        assert (plan.params["scheduler"], plan.params["chunk_size"]) == ("stallfree (url)", None)
        assert plan.run_id.startswith("engine=stallfree-url,qps=1.0")
        labelled = plan_run(config("target=url", f"target.url={server.url}", "target.label=vllm-0.6"))
        assert labelled.params["scheduler"] == labelled.params["engine_label"] == "vllm-0.6"


def test_a_probe_records_its_machine_and_is_measured_again_on_another(tmp_path, monkeypatch, capsys):
    from stallfree.loadgen.sweep import slo as slo_module

    cfg = config("slo=relaxed")
    monkeypatch.setattr(slo_module, "cpu_description", lambda: "CPU A, native bf16")
    monkeypatch.setattr(slo_module, "same_cpu", lambda hardware: None if not hardware else hardware.startswith("CPU A"))
    first = resolve_slo(cfg, tmp_path, Targets(StepTarget([10.0])))
    assert first["slo_reference_measured_on"] == "CPU A, native bf16"
    monkeypatch.setattr(slo_module, "_probed_here", set())  # a later process, same machine: the cached one
    assert resolve_slo(cfg, tmp_path, Targets(StepTarget([20.0]))) == first
    monkeypatch.setattr(slo_module, "cpu_description", lambda: "CPU B, no native bf16")
    monkeypatch.setattr(slo_module, "same_cpu", lambda hardware: None if not hardware else hardware.startswith("CPU B"))
    here = resolve_slo(cfg, tmp_path, Targets(StepTarget([20.0])))  # the results directory moved to CPU B
    assert abs(here["decode_iter_ms"] - 20.0) < 1e-6 and here["slo_reference_measured_on"] == "CPU B, no native bf16"
    assert ("[slo] the cached decode reference was measured on CPU A, native bf16; this machine is CPU B, no native "
            "bf16: measuring it here") in capsys.readouterr().out


def test_a_cost_model_of_another_cpu_is_a_loud_line_on_a_real_clock_only(tmp_path, monkeypatch, capsys):
    from stallfree.loadgen.sweep import slo as slo_module

    fitted_on = json.loads(COST_MODEL.read_text())["fitted_on"]["hardware"]
    monkeypatch.setattr(slo_module, "same_cpu", lambda hardware: False)
    monkeypatch.setattr(slo_module, "cpu_description", lambda: "Another CPU, native bf16")
    modelled = resolve_slo(config(f"slo.reference_cost_model={COST_MODEL}"), tmp_path, Targets(StepTarget([10.0])))
    assert modelled["slo_reference_measured_on"] == fitted_on
    assert (f"[slo] WARNING: slo.reference_cost_model small-cpu.json was fitted on {fitted_on}; this machine is "
            "Another CPU, native bf16") in capsys.readouterr().out
    resolve_slo(config(f"slo.reference_cost_model={COST_MODEL}", "model.runner=simulated", "model.clock=virtual",
                       f"model.cost_model={COST_MODEL}"), tmp_path,
                Targets(StepTarget([10.0])))
    assert "WARNING" not in capsys.readouterr().out
    monkeypatch.setattr(slo_module, "same_cpu", lambda hardware: True)
    resolve_slo(config(f"slo.reference_cost_model={COST_MODEL}"), tmp_path, Targets(StepTarget([10.0])))
    assert "WARNING" not in capsys.readouterr().out


def test_a_stallfree_probe_measures_our_engine_in_process_whatever_the_target(tmp_path):
    cfg = config("slo=relaxed", "slo.reference_probe=stallfree", "target=url", "target.url=http://127.0.0.1:9",
                 "decode_probe.rounds=1", "decode_probe.num_seqs=2", "decode_probe.output_tokens=8")
    targets = Targets(StepTarget([10.0]))  # the run's target: never probed
    slo = resolve_slo(cfg, tmp_path, targets)
    assert targets.gets == 0 and slo["slo_reference_method"] == "stallfree_probe"
    assert 0 < slo["decode_iter_ms"] < 1000 and slo["slo_reference_measured_on"]
    [cached] = (tmp_path / ".probes").glob("decode-*.json")
    assert json.loads(cached.read_text())["target"] == "inprocess"
    other = config("slo=relaxed", "slo.reference_probe=stallfree", "target=http", "decode_probe.rounds=1",
                   "decode_probe.num_seqs=2", "decode_probe.output_tokens=8")
    assert resolve_slo(other, tmp_path, targets) == slo  # every contender of the experiment: the one reference


def test_an_unknown_reference_probe_names_the_key():
    with pytest.raises(ConfigError, match="slo.reference_probe must be one of"):
        config("slo.reference_probe=vllm")
