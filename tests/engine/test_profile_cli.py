"""stallfree-profile recheck=PATH: a cost model rescaled by a speed check, or a one-line error."""
from stallfree.engine import CostModel
from stallfree.engine.profile_cli import main
from tests.helpers.engine import FIXED


def test_recheck_writes_the_model_rescaled_by_a_speed_check(tmp_path, capsys):
    FIXED.save(tmp_path / "fitted.json")
    assert main(["model=tiny", f"recheck={tmp_path / 'fitted.json'}", f"output={tmp_path / 'now.json'}"]) == 0
    now = CostModel.load(tmp_path / "now.json")
    assert now.coefficients == FIXED.coefficients
    assert set(now.speed_factors) == {"decode", "prefill", "hybrid"} and all(f > 0 for f in now.speed_factors.values())
    assert now.fitted_on["speed_check"]["factors"] == now.speed_factors
    assert "rescaled by its speed check" in capsys.readouterr().out


def test_recheck_of_a_missing_file_is_a_one_line_error(tmp_path, capsys):
    assert main(["model=tiny", f"recheck={tmp_path / 'none.json'}", f"output={tmp_path / 'now.json'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stallfree-profile: error: recheck: model.cost_model: cannot read") and err.count("\n") == 1
    assert not (tmp_path / "now.json").exists()
