"""Pipeline stages of the model: each stage holds (and reads) only its layers, the first the embedding and the
last the norm and LM head, and the stages run one after another give the whole model's logits bit for bit,
over iterations that use each stage's own KV cache."""
import dataclasses

import pytest
import torch

from stallfree.engine import EngineConfig
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.loader import read_checkpoint, weight_files
from stallfree.engine.model.stages import PipelineStage, stage_layer_counts
from stallfree.engine.runner.batch_prep import prepare_host_batch, to_device
from stallfree.engine.runner.factory import RunnerSetup, build_model_runner
from stallfree.engine.scheduler import ScheduledUnit, SchedulerOutput
from stallfree.engine.simulator.deployment import Deployment

BLOCK_SIZE = 8
GREEDY_UNIT = dict(is_prefill=True, samples=True)


def test_layers_split_as_the_simulator_splits_them():
    assert stage_layer_counts(12, 2) == (6, 6) and stage_layer_counts(10, 4) == (3, 3, 2, 2)
    assert stage_layer_counts(10, 4) == Deployment("g", "s", pp=4).stage_layers(10)
    assert [PipelineStage.of(10, i, 4).layers for i in range(4)] == [range(0, 3), range(3, 6), range(6, 8),
                                                                     range(8, 10)]
    with pytest.raises(ValueError, match="3 pipeline stages for 2 layers"):
        stage_layer_counts(2, 3)


def test_a_stage_names_only_its_weights():
    middle, last = PipelineStage.of(6, 1, 3), PipelineStage.of(6, 2, 3)
    assert middle.local_name("layers.2.mlp.down_proj.weight", False) == "layers.0.mlp.down_proj.weight"
    assert middle.local_name("layers.4.mlp.down_proj.weight", False) is None
    assert middle.local_name("embed_tokens.weight", False) is None and middle.local_name("norm.weight", False) is None
    assert last.local_name("norm.weight", False) == "norm.weight"
    assert last.local_name("embed_tokens.weight", True) == "lm_head.weight"  # tied: the LM head is the embedding
    assert last.local_name("embed_tokens.weight", False) is None


def stage_runners(path, num_stages: int) -> list:
    arch = ArchConfig.from_dir(path)
    config = EngineConfig.from_kwargs(model=str(path), dtype="float32", block_size=BLOCK_SIZE)
    setup = RunnerSetup(config, path, arch, 256, 32, torch.float32, torch.device("cpu"), set())
    return [build_model_runner(dataclasses.replace(setup, pipeline_stage=PipelineStage.of(arch.num_layers, i,
                                                                                          num_stages)))
            for i in range(num_stages)]


def logits(runners: list, units: list[ScheduledUnit]) -> torch.Tensor:
    """The stages one after another, each on the previous one's hidden states."""
    input_ids, positions, meta, logits_indices = to_device(prepare_host_batch(units, BLOCK_SIZE),
                                                           torch.device("cpu"))
    hidden = None
    with torch.inference_mode():
        for runner in runners[:-1]:
            hidden = runner.model.hidden_states(input_ids, positions, runner.attn_backend, runner.kv_caches, meta,
                                                hidden)
        last = runners[-1]
        return last.model(input_ids, positions, last.attn_backend, last.kv_caches, meta, logits_indices, hidden)


def unit(request_id: str, token_ids: list[int], computed: int, table: list[int], samples: bool = True,
         is_prefill: bool = True) -> ScheduledUnit:
    from stallfree.engine.request import SamplingParams
    return ScheduledUnit(request_id, token_ids, computed, is_prefill, samples, table,
                         SamplingParams(max_tokens=4, temperature=0.0))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: tied embeddings and a QKV bias
def test_stages_in_a_row_give_the_whole_models_logits_bit_for_bit(arch_paths, arch):
    path = arch_paths[arch]
    whole, staged = stage_runners(path, 1), stage_runners(path, 2)
    first, last = (runner.model for runner in staged)
    assert len(first.layers) == len(last.layers) == 1 and len(staged[0].kv_caches) == 1
    assert hasattr(first, "embed_tokens") and not hasattr(first, "lm_head") and not hasattr(first, "norm")
    assert hasattr(last, "lm_head") and not hasattr(last, "embed_tokens")
    a, b = list(range(5, 25)), list(range(100, 107))
    tables = {"a": [3, 7, 1], "b": [0, 9]}
    steps = [[unit("a", a[:12], 0, tables["a"], samples=False), unit("b", b, 0, tables["b"])],
             [unit("b", [17], len(b), tables["b"], is_prefill=False), unit("a", a[12:], 12, tables["a"])],
             [unit("b", [18], len(b) + 1, tables["b"], is_prefill=False), unit("a", [19], len(a), tables["a"],
                                                                               is_prefill=False)]]
    for units in steps:
        expected = logits(whole, units)
        assert expected.numel() and torch.equal(logits(staged, units), expected)


def test_a_stage_reads_only_its_tensors(tiny_path):
    names = set(read_checkpoint(weight_files(tiny_path), stage=PipelineStage.of(2, 1, 2)))
    assert names == {n for n in read_checkpoint(weight_files(tiny_path))
                     if n.startswith(("model.layers.1.", "model.norm.", "lm_head."))}


def test_the_stage_split_runs_through_the_runner(tiny_path):
    """The runner's own entry points: the first stage's execute_forward feeds the last stage's execute_model,
    which samples the whole model's greedy tokens."""
    whole, (first, last) = stage_runners(tiny_path, 1)[0], stage_runners(tiny_path, 2)
    output = SchedulerOutput([unit("a", list(range(3, 40)), 0, [0, 1, 2, 3, 4])])
    staged = last.execute_model(output, first.execute_forward(output))
    assert staged.sampled_token_ids == whole.execute_model(output).sampled_token_ids
