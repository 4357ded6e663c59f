"""OperatorCostModel: TP composition, stage extras, StageBatch from a SchedulerOutput, provenance."""
import json
from dataclasses import replace

import pytest

from stallfree.engine.request import SamplingParams
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput
from stallfree.engine.simulator.ops import OperatorCostModel, StageBatch
from stallfree.engine.simulator.ops.operator_costs import TABLE_TOKENS
from stallfree.engine.simulator.shapes import SHAPES

LINEAR = ("qkv_proj", "o_proj", "mlp_up_gate", "mlp_down")
PREFILL = StageBatch(((512, 1000),), (300, 2000))


@pytest.fixture(scope="module")
def by_tp():
    return {tp: OperatorCostModel.build("a100", SHAPES["llama2-70b"], tp, "nvlink") for tp in (1, 2, 4)}


def test_more_tp_means_less_linear_time_per_gpu_plus_an_all_reduce(by_tp):
    layers = {tp: m.layer_seconds(PREFILL) for tp, m in by_tp.items()}
    linear = {tp: sum(layer[op] for op in LINEAR) for tp, layer in layers.items()}
    assert linear[1] > 1.6 * linear[2] > 1.6 * 1.6 * linear[4]
    assert layers[1]["tp_all_reduce"] == 0.0 < layers[2]["tp_all_reduce"]
    assert layers[4]["attn_prefill"] < layers[2]["attn_prefill"] < layers[1]["attn_prefill"]


def test_parallel_attention_and_mlp_halve_the_all_reduces():
    falcon = SHAPES["falcon-180b"]
    parallel = OperatorCostModel.build("a100", falcon, 8, "dgx").layer_seconds(PREFILL)
    sequential = OperatorCostModel.build("a100", replace(falcon, parallel_attn_mlp=False), 8, "dgx")
    assert parallel["tp_all_reduce"] == pytest.approx(sequential.layer_seconds(PREFILL)["tp_all_reduce"] / 2)


def test_stage_seconds_is_layers_times_a_layer_plus_first_and_last_extras(by_tp):
    model = by_tp[2]
    layer = sum(model.layer_seconds(PREFILL).values())
    middle = model.stage_seconds(PREFILL, 10, first=False, last=False)
    assert middle == pytest.approx(10 * layer)
    first = model.stage_seconds(PREFILL, 10, first=True, last=False)
    last = model.stage_seconds(PREFILL, 10, first=False, last=True)
    assert first - middle == pytest.approx(model.tables["embedding"][PREFILL.num_tokens])
    # the LM head runs on one token per sequence (3 here), the final norm on every token
    assert last - middle == pytest.approx(model.tables["final_norm"][514] + model.tables["lm_head"][3])
    assert model.stage_seconds(PREFILL, 10, first=True, last=True) == pytest.approx(first + last - middle)


def test_token_counts_past_the_tables_are_split_into_pieces(by_tp):
    model = by_tp[1]
    big = StageBatch(((TABLE_TOKENS + 100, 0),), ())
    linear = model.layer_seconds(big)["mlp_up_gate"]
    assert linear == pytest.approx(model.tables["mlp_up_gate"][TABLE_TOKENS] + model.tables["mlp_up_gate"][100])


def test_stage_batch_of_a_scheduler_output():
    def unit(n_new, cached, prefill):
        return ScheduledUnit("r", list(range(n_new)), cached, prefill, True, [0], SamplingParams())
    out = SchedulerOutput(units=[unit(1, 99, False), unit(1, 9, False), unit(256, 512, True)])
    batch = StageBatch.of(out)
    assert batch == StageBatch(((256, 512),), (100, 10))
    assert batch.num_tokens == 258 and batch.decode_context_tokens == 110 and batch.num_seqs == 3


def test_describe_names_every_input_file_and_assumption(by_tp):
    described = by_tp[4].describe()
    json.dumps(described)  # the JSON the benchmark writes
    paths = [i["path"] for i in described["inputs"]]
    assert all(i["repository"] == "https://github.com/microsoft/vidur" and len(i["commit"]) == 40
               for i in described["inputs"])
    assert "data/profiling/a100/attention.csv" in paths
    assert "data/profiling/network/a100_pairwise_nvlink/all_reduce.csv" in paths
    assert "data/profiling/compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv" in paths
    assert "data/profiling/a100/cpu_overheads.csv" in paths
    assert len(described["assumptions"]) >= 10


def test_per_iteration_cpu_overhead_and_pp_send(by_tp):
    model = by_tp[2]
    assert 0 < model.cpu_overhead_seconds(StageBatch((), (10,) * 8)) < model.cpu_overhead_seconds(
        StageBatch((), (10,) * 128))
    assert 0 < model.pp_send_seconds(16) < model.pp_send_seconds(4096)


@pytest.mark.parametrize("gpu, tp, interconnect, key", [("b200", 1, "nvlink", "gpu"), ("a100", 3, "nvlink", "tp"),
                                                       ("a100", 2, "pcie", "interconnect")])
def test_a_bad_deployment_names_the_key(gpu, tp, interconnect, key):
    with pytest.raises(ValueError, match=f"^{key}:"):
        OperatorCostModel.build(gpu, SHAPES["llama2-70b"], tp, interconnect)


def test_the_profiles_tile_steps_survive_for_an_unprofiled_model():
    """Yi-34B is not profiled: its GEMMs jump where its profiled neighbours' do (at 128 -> 129 rows)."""
    tables = OperatorCostModel.build("a100", SHAPES["yi-34b"], 2, "nvlink").tables
    for op in ("qkv_proj", "mlp_up_gate"):
        assert tables[op][129] > 1.25 * tables[op][128]
        assert tables[op][129] == tables[op][136]
