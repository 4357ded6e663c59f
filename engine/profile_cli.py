"""``stallfree-profile``: run a model's real runner over the profile's iteration shapes, fit its cost model
and write it as JSON, for ``model.runner=simulated model.cost_model=PATH``.

    stallfree-profile model=small output=engine/simulator/fitting/cost_models/small-cpu.json
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from tqdm import tqdm

from stallfree.engine import EngineConfig
from stallfree.engine.config_checks import require
from stallfree.engine.hydra_config import check_engine, compose, one_line, typed

PROG = "stallfree-profile"
USAGE = f"""usage: {PROG} output=PATH [model=tiny|small|path model.model=DIR] [num_requests=N] [seed=N]
       {PROG} recheck=PATH output=PATH [model=...]

Hydra overrides of conf/profile.yaml (the model group and engine keys are the ones stallfree-bench uses). Profiles on the
model's device (model.device), writes the cost model with what it was fitted on and its held-out error.
With recheck=PATH it profiles nothing: a speed check of a few seconds (engine/simulator/fitting/speed_check.py)
rescales the cost model at PATH to how fast the model's real runner runs now, and writes it to output."""


@dataclass(kw_only=True)
class ProfileConfig(EngineConfig):
    """conf/profile.yaml, checked: the engine's sections, then the profile's."""

    output: str  # where the cost model JSON goes
    recheck: str | None = None  # a cost model JSON to rescale to this machine's speed now, instead of profiling
    num_requests: int = 24  # requests per profiled policy
    seed: int = 0

    def __post_init__(self) -> None:
        check_engine(self)
        require(self.num_requests >= 2, "num_requests", "an integer >= 2", self.num_requests)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if {"-h", "--help"} & set(args):
        print(USAGE)
        return 0
    from stallfree.engine import LLMEngine, profile_cost_model  # torch: only once the command runs

    try:
        cfg = typed(ProfileConfig, compose("profile", args, job_name=PROG))
        config = cfg.engine_sections()
        if cfg.recheck:
            return _recheck(cfg, config)
        with tqdm(total=3 * cfg.num_requests, desc="profiling", unit="req") as bar:
            model = profile_cost_model(config, LLMEngine, num_requests=cfg.num_requests, seed=cfg.seed,
                                       use_cache=False, progress=bar.update)
        model.save(cfg.output)
    except Exception as exc:  # any bad value: one line, no traceback
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    error = model.holdout_error
    print(f"{PROG}: wrote {cfg.output} (fitted on {model.fitted_on['num_records']} iterations; held-out "
          f"error median {error['median_abs_pct']}%, p90 {error['p90_abs_pct']}%)")
    return 0


def _recheck(cfg: ProfileConfig, config) -> int:
    from dataclasses import replace

    from stallfree.engine import CostModel, LLMEngine, check_speed

    try:
        model = CostModel.load(cfg.recheck)
    except ValueError as exc:
        raise ValueError(f"recheck: {exc}") from exc
    engine = LLMEngine(replace(config, model=replace(config.model, runner="model")))
    check = check_speed(engine, model, seed=cfg.seed)
    model.rescaled(check.factors, check.describe()).save(cfg.output)
    print(f"{PROG}: wrote {cfg.output}: {cfg.recheck} rescaled by its speed check, actual / predicted "
          + ", ".join(f"{kind} {factor:.3f} ({check.num_iterations[kind]} iterations)"
                      for kind, factor in check.factors.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
