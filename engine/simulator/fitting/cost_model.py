"""The simulated runner's cost model: iteration seconds as a linear function of what the iteration computes,
fitted on the real runner's BatchRecords, saved and loaded as JSON with what it was fitted on.

Features (``IterationFeatures``): a fixed per-iteration cost, prefill tokens, decode sequences, and the
attention work: for each prefill chunk its tokens x the context they attend to, and for the decodes the
sum of their context lengths. The fit is least squares on seconds (weighting iterations by 1 / their
time fitted this machine's profile worse: its decode iterations are nearly flat in batch size and noisy),
keeps no negative per-unit cost, and records its relative error on held-out iterations. ``residual_quantiles`` (actual / predicted over the profile)
let the simulator replay the real iterations' spread, whose tail decides TBT percentiles and SLOs. They
are kept apart for decode-only, prefill-only and hybrid iterations, and within each kind per bucket of
predicted time, so that a prefill chunk draws from the spread of prefill chunks of about its length, not
from that of short decode steps, which OS noise moves by a larger fraction.
"""
from __future__ import annotations

import bisect
import json
import logging
import math
import random
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch

from stallfree.engine.records import BatchRecord

log = logging.getLogger(__name__)

# Bump when the features, the fit or the profile change: cached profiles are then refitted. 5: the profile
# samples greedily, as the load generator does. 6: half of each policy's profiled requests arrive staggered;
# residuals kept apart for decode-only iterations and those with prefill tokens. 7: prefill-only iterations
# (vllm's) kept apart from hybrid ones (sarathi's). 8: the profile holds prompts as long as the context.
COST_MODEL_VERSION = 8
# decode-only iterations, prefill-only ones and hybrids (prefill tokens beside decodes). One linear fit
# serves all three, and misses them differently: on a 2-core Xeon, vllm's prefill-only iterations ran
# 13% slower than the fit predicted at every size while its decode steps ran 12% faster.
RESIDUAL_KINDS = ("decode", "prefill", "hybrid")
# Bump when the real runner's speed changes (kernels, linears): profiles of an older engine are refitted
# when cached, and named in a warning when loaded from a file. 2: fp32 CPU linears on oneDNN.
# 3: fused native layer ops on the CPU. 4: packed bf16 CPU linears; paired-bf16 and wide decode attention.
# 5: prefill attention on AMX; packed linears in pieces where oneDNN's whole-input kernel is slow.
# 6: bf16 linears on the engine's AMX kernel (gate_up with SiLU-and-mul); greedy sampling through max.
# 7: vectorized bf16 norms, rotary and cache writes; the AMX linears' output per row group; a native argmax.
# 8: each decoder layer in one native call where all its parts are native (bf16 on AMX).
# 9: bf16 linears on the tiled kernel's AVX512-BF16 path where the CPU has no AMX (and so the one-call layer there).
ENGINE_REVISION = 9
NUM_RESIDUAL_QUANTILES = 41
NUM_RESIDUAL_BUCKETS = 3  # of predicted time, equal in profiled iterations
MIN_BUCKET_RECORDS = 30
DISTURBED_IQRS = 3.0  # Tukey's far-out fence: a ratio this many interquartile ranges beyond the quartiles
MIN_IQR = 0.1  # of actual / predicted: iterations mostly alike (a quarter 20% slower is spread, not a disturbance)
HOLDOUT_FRACTION = 0.2


@dataclass(frozen=True)
class IterationFeatures:
    num_prefill_tokens: int
    num_decode_seqs: int
    prefill_attention_work: int  # sum over prefill chunks of chunk tokens x (cached context + chunk tokens)
    decode_context_tokens: int  # sum over decodes of their context length (including the new token)

    @classmethod
    def of(cls, record) -> IterationFeatures:
        """From anything with these four attributes: a BatchRecord or a SchedulerOutput."""
        return cls(*(getattr(record, name) for name in COUNTS))

    def row(self) -> list[float]:
        """The values of FEATURES: two fixed costs, then the four counts."""
        return [1.0, float(self.num_decode_seqs > 0), *(float(getattr(self, name)) for name in COUNTS)]


COUNTS = tuple(f.name for f in fields(IterationFeatures))  # once: row() runs for every simulated iteration


# decode_pass: the fixed cost of an iteration that runs decodes (their attention path and sampling beside
# the prefill's). Without it the intercept carries it, and fits on this machine's profiles put short
# prefill-only iterations (a lone prompt's, as vllm runs them under open-loop arrivals) 2-8% too slow.
FEATURES = ("intercept", "decode_pass", *COUNTS)


@dataclass
class CostModel:
    coefficients: dict[str, float]  # seconds per unit of each feature (intercept: seconds per iteration)
    # actual / predicted iteration time over the profile, at evenly spaced quantiles (1.0 each: no spread),
    # per kind (RESIDUAL_KINDS), one list per bucket of predicted time; a list of lists or a flat list (one
    # bucket) serves both kinds
    residual_quantiles: dict[str, list[list[float]]] | list = field(default_factory=lambda: [[1.0]])
    # per kind, the predicted time where each next bucket starts
    residual_bounds_s: dict[str, list[float]] | list[float] = field(default_factory=list)
    fitted_on: dict = field(default_factory=dict)  # model, device, dtype, backend, threads, records, date, ...
    holdout_error: dict = field(default_factory=dict)  # relative error on iterations left out of the fit
    # per kind (RESIDUAL_KINDS), how much slower than fitted the runner ran at its last speed check
    # (engine/simulator/fitting/speed_check.py); predictions are scaled by it, 1.0 where absent
    speed_factors: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.residual_quantiles, list):
            quantiles = self.residual_quantiles
            quantiles = [quantiles] if quantiles and not isinstance(quantiles[0], list) else quantiles
            self.residual_quantiles = dict.fromkeys(RESIDUAL_KINDS, quantiles)
        if isinstance(self.residual_bounds_s, list):
            self.residual_bounds_s = dict.fromkeys(RESIDUAL_KINDS, self.residual_bounds_s)
        for kinds in (self.residual_quantiles, self.residual_bounds_s, self.speed_factors):
            if "prefill" in kinds and "hybrid" not in kinds:  # version 6: one kind for all iterations with prefill
                kinds["hybrid"] = kinds["prefill"]

    def predict(self, features: IterationFeatures) -> float:
        """The expected time of one iteration, in seconds."""
        fitted = sum(c * x for c, x in zip(self._coefficient_row(), features.row(), strict=True))
        return max(0.0, fitted * self.speed_factors.get(iteration_kind(features), 1.0))

    def sample(self, features: IterationFeatures, rng: random.Random) -> float:
        """One iteration's time: the expected time scaled by a residual drawn from the profiled iterations
        of the same kind and about the same expected time."""
        predicted = self.predict(features)
        kind = iteration_kind(features)
        # the buckets are in fitted seconds
        bucket = bisect.bisect_right(self.residual_bounds_s[kind], predicted / self.speed_factors.get(kind, 1.0))
        return predicted * rng.choice(self.residual_quantiles[kind][bucket])

    def rescaled(self, factors: dict[str, float], checked: dict) -> CostModel:
        """This model with its predictions of each kind scaled by ``factors`` (actual / predicted, as a speed
        check measures them), on top of any earlier scaling; ``checked`` describes the check."""
        speed = {kind: round(self.speed_factors.get(kind, 1.0) * factors.get(kind, 1.0), 4) for kind in RESIDUAL_KINDS}
        return replace(self, speed_factors=speed, fitted_on={**self.fitted_on, "speed_check": checked})

    def _coefficient_row(self) -> list[float]:
        return [self.coefficients.get(name, 0.0) for name in FEATURES]

    @classmethod
    def fit(cls, records: list[BatchRecord], *, seed: int = 0, fitted_on: dict | None = None,
            relative: bool = False) -> CostModel:
        """Fit on ``records``; the held-out error comes from a fit on the other records (a seeded split).
        ``relative``: least squares of the relative error (each iteration weighted by 1 / its time), so that
        short decode iterations weigh as much as whole-prompt prefills 100x longer; absolute seconds otherwise."""
        if len(records) < 2 * len(FEATURES):
            raise ValueError(f"fitting a cost model needs at least {2 * len(FEATURES)} BatchRecords, "
                             f"got {len(records)}")
        shuffled = random.Random(seed).sample(records, len(records))
        num_holdout = max(1, int(len(records) * HOLDOUT_FRACTION))
        holdout, train = shuffled[:num_holdout], shuffled[num_holdout:]
        held_out_errors = _relative_errors(_least_squares(train, relative), holdout)
        kept = _undisturbed(_least_squares(records, relative), records)
        coefficients = _least_squares(kept, relative)
        predicted = [(iteration_kind(r), p, _seconds(r) / p) for r in kept if (p := _predict(coefficients, r)) > 0]
        buckets = {kind: _residual_buckets(sorted((p, ratio) for k, p, ratio in predicted if k == kind)
                                           or sorted((p, ratio) for _, p, ratio in predicted))
                   for kind in RESIDUAL_KINDS}  # a kind the profile lacks takes the spread of all iterations
        return cls(coefficients=coefficients, residual_quantiles={k: q for k, (_, q) in buckets.items()},
                   residual_bounds_s={k: b for k, (b, _) in buckets.items()},
                   fitted_on={**(fitted_on or {}), "num_records": len(records),
                              "least_squares": "relative" if relative else "absolute",
                              "num_disturbed": len(records) - len(kept), "version": COST_MODEL_VERSION},
                   holdout_error={"num_iterations": len(holdout),
                                  "median_abs_pct": round(float(held_out_errors.abs().median()) * 100, 2),
                                  "p90_abs_pct": round(float(held_out_errors.abs().quantile(0.9)) * 100, 2),
                                  "mean_pct": round(float(held_out_errors.mean()) * 100, 2)})

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        try:
            model = cls(**json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"model.cost_model: cannot read a cost model from {path}: {exc}") from exc
        unknown = set(model.coefficients) - set(FEATURES)
        residuals = model.residual_quantiles
        if unknown or set(residuals) != set(RESIDUAL_KINDS) or not all(residuals.values()):
            raise ValueError(f"model.cost_model: {path} is not a version-{COST_MODEL_VERSION} cost model "
                             f"(unknown features {sorted(unknown)}); profile it again with stallfree-profile")
        profiled_on = model.fitted_on.get("engine_revision", 1) if "num_records" in model.fitted_on else None
        if profiled_on not in (None, ENGINE_REVISION):
            log.warning("model.cost_model: %s was profiled on engine revision %s, this engine is revision %s; "
                        "its iteration times may be off: profile it again with stallfree-profile",
                        path, profiled_on, ENGINE_REVISION)
        return model


def iteration_kind(features) -> str:
    """The residual kind of an iteration (IterationFeatures or BatchRecord): decode, prefill or hybrid."""
    if not features.num_prefill_tokens:
        return "decode"
    return "hybrid" if features.num_decode_seqs else "prefill"


def _seconds(record: BatchRecord) -> float:
    return record.end_time - record.start_time


def _predict(coefficients: dict[str, float], record: BatchRecord) -> float:
    row = IterationFeatures.of(record).row()
    return sum(coefficients[name] * x for name, x in zip(FEATURES, row, strict=True))


def _residual_buckets(predicted: list[tuple[float, float]]) -> tuple[list[float], list[list[float]]]:
    """(predicted seconds, actual / predicted) pairs, sorted, into NUM_RESIDUAL_BUCKETS runs of equal
    size (none under MIN_BUCKET_RECORDS): the predicted time where each bucket after the first starts,
    and each bucket's ratios at evenly spaced quantiles."""
    size = max(MIN_BUCKET_RECORDS, math.ceil(len(predicted) / NUM_RESIDUAL_BUCKETS))
    buckets = [predicted[i:i + size] for i in range(0, len(predicted), size)]
    if len(buckets) > 1 and len(buckets[-1]) < MIN_BUCKET_RECORDS:
        last = buckets.pop()
        buckets[-1] += last
    return [bucket[0][0] for bucket in buckets[1:]], [evenly_spaced_quantiles([r for _, r in bucket], 4)
                                                      for bucket in buckets]


def evenly_spaced_quantiles(values: list[float], digits: int) -> list[float]:
    """``values`` at NUM_RESIDUAL_QUANTILES evenly spaced quantiles (the minimum to the maximum), rounded: a
    distribution a simulation draws from with ``random.choice``."""
    levels = torch.linspace(0, 1, NUM_RESIDUAL_QUANTILES, dtype=torch.float64)
    return [round(float(q), digits) for q in torch.quantile(torch.tensor(values, dtype=torch.float64), levels)]


def _undisturbed(coefficients: dict[str, float], records: list[BatchRecord]) -> list[BatchRecord]:
    """The records whose actual / predicted time lies within Tukey's far-out fences of their kind's. One
    decode step of 104 ms among 13 ms ones is an event of the profile's moment (a VM neighbour, a page-fault
    storm), not the engine's spread: kept, such outliers were drawn for one simulated iteration in 40 and put
    the simulated P99 TBT of sarathi-128 at 4 QPS 46% above the real one (docs/performance.md)."""
    kept = []
    for kind in RESIDUAL_KINDS:
        group = [(r, _seconds(r) / p if (p := _predict(coefficients, r)) > 0 else 1.0)
                 for r in records if iteration_kind(r) == kind]
        if len(group) < 4:
            kept += [r for r, _ in group]
            continue
        q1, q3 = (float(q) for q in torch.quantile(torch.tensor([x for _, x in group], dtype=torch.float64),
                                                   torch.tensor([0.25, 0.75], dtype=torch.float64)))
        spread = max(q3 - q1, MIN_IQR)
        low, high = q1 - DISTURBED_IQRS * spread, q3 + DISTURBED_IQRS * spread
        kept += [r for r, ratio in group if low <= ratio <= high]
    return kept


def _relative_errors(coefficients: dict[str, float], records: list[BatchRecord]) -> torch.Tensor:
    return torch.tensor([_predict(coefficients, r) / _seconds(r) - 1 for r in records], dtype=torch.float64)


def _least_squares(records: list[BatchRecord], relative: bool = False) -> dict[str, float]:
    """Least squares with no negative per-unit cost: a feature whose coefficient comes out negative (noise,
    on a model whose iterations are mostly overhead) is dropped and the rest refitted. ``relative``: of the
    relative error (rows divided by the iteration's time)."""
    x = torch.tensor([IterationFeatures.of(r).row() for r in records], dtype=torch.float64)
    y = torch.tensor([[_seconds(r)] for r in records], dtype=torch.float64)
    if relative:
        x, y = x / y, torch.ones_like(y)
    active = list(range(len(FEATURES)))
    while True:
        coef = torch.linalg.lstsq(x[:, active], y, driver="gelsd").solution.flatten()
        worst = int(coef[1:].argmin()) + 1 if len(active) > 1 else 0
        if worst == 0 or coef[worst] >= 0:
            break
        del active[worst]
    return dict.fromkeys(FEATURES, 0.0) | {FEATURES[i]: float(c) for i, c in zip(active, coef, strict=True)}
