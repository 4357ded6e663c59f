"""The GEMM model's machinery on a toy profile: token curves keep tile steps, shapes interpolate."""
import math

import pytest

from stallfree.engine.simulator.ops.curves import ShapeInterpolator, TokenCurve

COUNTS = [1, 8, 16, 64, 128, 136, 256, 512]


def toy_seconds(m: int, k: int, n: int) -> float:
    """A GEMM that streams its weights below 64 rows and is compute-bound above, in tiles of 128 rows."""
    tiles = math.ceil(m / 128)
    return k * n * 2e-12 * max(1.0, tiles * 128 / 64)


def toy_curve(k: int, n: int) -> TokenCurve:
    return TokenCurve.of((k, n), {m: [toy_seconds(m, k, n)] for m in COUNTS}, source=f"toy {k}x{n}")


def test_token_curve_takes_the_next_profiled_count_and_adds_pieces_beyond_the_last():
    curve = TokenCurve.of((4, 4), {8: [1.0, 3.0], 16: [5.0]})
    assert curve.at(1) == 2.0 and curve.at(8) == 2.0  # repeated measurements averaged
    assert curve.at(9) == 5.0 and curve.at(16) == 5.0
    assert curve.at(40) == pytest.approx(2 * 5.0 + 2.0)  # 16 + 16 + 8


def test_a_tile_step_survives_the_fit_for_an_unprofiled_shape():
    interp = ShapeInterpolator(tuple(toy_curve(k, n) for k, n in [(1024, 1024), (2048, 4096), (4096, 2048),
                                                                   (4096, 4096), (8192, 8192)]))
    table = interp.table((3072, 3072), 300)
    assert table[0] == 0.0
    # the step from one tile of 128 rows to two is as sharp as in every profiled curve: 2x within 8 rows
    assert table[136] / table[128] == pytest.approx(2.0, rel=1e-6)
    assert table[129] == table[136]
    # flat inside a tile and in the weight-streaming regime
    assert table[1] == table[64] and table[200] == table[256]
    # scale-free shapes: the toy's time per weight is the same everywhere, so the prediction is exact
    assert table[256] == pytest.approx(toy_seconds(256, 3072, 3072), rel=1e-9)


def test_the_nearest_shapes_weigh_most_and_an_exact_match_dominates():
    curves = (TokenCurve.of((1024, 1024), {1: [1.0]}), TokenCurve.of((4096, 4096), {1: [32.0]}),
              TokenCurve.of((2048, 2048), {1: [8.0]}))
    near = ShapeInterpolator(curves).nearest((2048, 2048))
    assert near[0][1].shape == (2048, 2048) and near[0][0] > 0.95
    assert sum(w for w, _ in near) == pytest.approx(1.0)
    # halfway between two profiled shapes: the geometric mean of their time per weight (1 and 2 units of
    # 2^-20 s), times the target's 4 x 2^20 weights
    two = ShapeInterpolator(curves[:2]).table_at((2048, 2048), [1])[0]
    assert two == pytest.approx(4 * math.sqrt(2))


def test_an_empty_profile_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        ShapeInterpolator(())
