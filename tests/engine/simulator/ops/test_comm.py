"""TP all-reduce and PP send/recv from Vidur's NCCL profiles; interconnect names."""
import pytest

from stallfree.engine.simulator.ops.comm import CommModel, SizeCurve, profile_files


def test_a_size_curve_interpolates_and_extrapolates_along_the_last_bandwidth():
    curve = SizeCurve((100, 200, 400), (1.0, 2.0, 3.0), "toy")
    assert curve.at(150) == pytest.approx(1.5)
    assert curve.at(800) == pytest.approx(6.0)  # 400 bytes per 3 s
    noisy = SizeCurve((100, 200, 400), (1.0, 2.0, 1.9), "toy")  # the last row measured faster than the one before
    assert noisy.at(800) == pytest.approx(3.8)
    assert curve.at(10) == 1.0  # never below the smallest message's time


def test_interconnects_map_to_profiles():
    assert profile_files("a100", "nvlink", 1) == (None, 1, "network/a100_pairwise_nvlink/send_recv.csv.gz", 2)
    assert profile_files("a100", "nvlink", 8)[0] == "network/a100_dgx/all_reduce.csv.gz"
    assert profile_files("h200", "dgx", 4)[0] == "network/h100_dgx/all_reduce.csv.gz"
    assert profile_files("a40", "pcie", 4)[0] == "network/a40/all_reduce.csv.gz"
    assert profile_files("a100", "nvlink-internode", 4)[1:] == (4, "network/a100_pairwise_nvlink/send_recv.csv.gz", 1)
    assert profile_files("a100", "nvlink-internode", 8)[:2] == ("network/a100_dgx/all_reduce.csv.gz", 4)


@pytest.mark.parametrize("gpu, interconnect, tp, message", [
    ("a100", "pcie", 2, "interconnect"), ("a40", "dgx", 2, "interconnect"), ("v100", "nvlink", 2, "gpu"),
    ("a100", "dgx", 16, "tp"),
])
def test_a_bad_deployment_names_the_key(gpu, interconnect, tp, message):
    with pytest.raises(ValueError, match=f"^{message}:"):
        profile_files(gpu, interconnect, tp)


def test_all_reduce_grows_with_tokens_and_crossing_nodes_slows_the_send():
    tp4 = CommModel.build("a100", "nvlink", 4, hidden_size=8192)
    assert 0 < tp4.all_reduce_seconds(16) < tp4.all_reduce_seconds(512) < tp4.all_reduce_seconds(4096)
    assert CommModel.build("a100", "nvlink", 1, 8192).all_reduce_seconds(512) == 0.0
    inter = CommModel.build("a100", "nvlink-internode", 4, 8192)
    assert inter.send_seconds(2048) > tp4.send_seconds(2048) > 0


def test_a_tp_group_larger_than_a_node_all_reduces_across_nodes():
    """Falcon-180B's hidden size at TP8: two 4-GPU nodes (Vidur's measured cross-node rows) are slower
    than one 8-GPU NVSwitch node, for small and large batches alike."""
    one_node = CommModel.build("a100", "dgx", 8, hidden_size=14848)
    two_nodes = CommModel.build("a100", "nvlink-internode", 8, hidden_size=14848)
    for tokens in (8, 512, 4096):
        assert two_nodes.all_reduce_seconds(tokens) > one_node.all_reduce_seconds(tokens)
    with pytest.raises(ValueError, match="^interconnect:.*8 GPUs with 4 per node"):
        CommModel.build("h100", "nvlink-internode", 8, hidden_size=8192)  # no such H100 profile
