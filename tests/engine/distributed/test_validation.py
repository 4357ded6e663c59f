"""Sizes that do not fit the model or the machine: one line naming the option and the counts, exit 2."""
import dataclasses
import os

import pytest
import torch

from stallfree.engine import LLMEngine
from stallfree.engine.config import ParallelConfig
from stallfree.engine.config_checks import ConfigError
from stallfree.engine.distributed.validation import check_parallel
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.server import cli

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def arch(tiny_path):
    return ArchConfig.from_dir(tiny_path)  # 4 heads, 2 KV heads, 2 layers


def test_tp_that_does_not_divide_the_kv_heads(arch):
    eight = dataclasses.replace(arch, num_heads=24, num_kv_heads=8, intermediate_size=768)
    with pytest.raises(ConfigError, match=r"^tensor_parallel_size=3 does not divide the model's 8 KV heads "
                                          r"\(24 attention heads, 8 KV heads\)$"):
        check_parallel(ParallelConfig(tensor_parallel_size=3), eight, CPU, 3, "model")


def test_pp_beyond_the_layers(arch):
    with pytest.raises(ConfigError, match="^pipeline_parallel_size=3 is more than the model's 2 layers$"):
        check_parallel(ParallelConfig(pipeline_parallel_size=3), arch, CPU, 3, "model")


def test_more_ranks_than_cores(arch):
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match=f"needs {cores + 1} ranks on this node, one per device, but it has "
                                          f"{cores} CPU cores$"):
        check_parallel(ParallelConfig(tensor_parallel_size=1, pipeline_parallel_size=2), arch, CPU, cores + 1,
                       "model")


def test_simulated_runner_is_refused(arch):
    with pytest.raises(ConfigError, match="need runner=model, got runner='simulated'"):
        check_parallel(ParallelConfig(tensor_parallel_size=2), arch, CPU, 2, "simulated")


def test_engine_refuses_before_starting_a_process(tiny_path):
    with pytest.raises(ConfigError, match="tensor_parallel_size=4 does not divide the model's 2 KV heads"):
        LLMEngine.from_kwargs(model="tiny", device="cpu", tensor_parallel_size=4)


def test_serve_exits_2_with_one_line(capsys):
    assert cli.main(["tiny", "model.device=cpu", "parallel.tensor_parallel_size=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("stallfree-serve: error: tensor_parallel_size=3 does not divide the model's 4 attention heads "
                   "(4 attention heads, 2 KV heads)")


def test_serve_refuses_a_size_below_one(capsys):
    assert cli.main(["tiny", "parallel.pipeline_parallel_size=0"]) == 2
    assert "parallel.pipeline_parallel_size must be an integer >= 1, got 0" in capsys.readouterr().err
