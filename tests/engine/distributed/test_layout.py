from stallfree.engine.distributed.layout import RankLayout


def test_tp2_pp2_grid():
    layout = RankLayout(tensor_parallel_size=2, pipeline_parallel_size=2)
    assert layout.world_size == 4
    assert layout.tp_groups() == [[0, 1], [2, 3]]  # a stage's ranks are contiguous
    assert layout.pp_groups() == [[0, 2], [1, 3]]
    assert [(layout.tp_rank(r), layout.pp_rank(r)) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_one_process():
    assert RankLayout(1, 1).tp_groups() == [[0]] and RankLayout(1, 1).pp_groups() == [[0]]
