"""The simulated runner's cost model: iteration seconds as a linear function of the batch, fitted on the
real runner's BatchRecords (``profile_cost_model``), saved and loaded as JSON."""
from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

import torch

from engine.config import EngineConfig
from engine.model.presets import cache_root
from engine.outputs import BatchRecord
from engine.request import SamplingParams

FEATURES = ("intercept", "num_prefill_tokens", "num_decode_tokens", "num_kv_blocks_used")
COST_MODEL_VERSION = 1  # part of the profile cache key: bump when the features or the fit change


@dataclass
class CostModel:
    """Iteration seconds = a linear function of the batch's prefill tokens, decode tokens and the KV
    blocks in use (a proxy for the attention context the iteration reads)."""

    intercept: float
    num_prefill_tokens: float
    num_decode_tokens: float
    num_kv_blocks_used: float

    def predict(self, num_prefill_tokens: int, num_decode_tokens: int, num_kv_blocks_used: int) -> float:
        return max(0.0, self.intercept + self.num_prefill_tokens * num_prefill_tokens
                   + self.num_decode_tokens * num_decode_tokens + self.num_kv_blocks_used * num_kv_blocks_used)

    @classmethod
    def fit(cls, records: list[BatchRecord]) -> CostModel:
        """Least squares over the iterations' durations, with no negative per-unit cost: a feature whose
        coefficient comes out negative (noise, on a model whose iterations are all overhead) is dropped
        and the rest refitted."""
        if len(records) < len(FEATURES):
            raise ValueError(f"fitting a cost model needs at least {len(FEATURES)} BatchRecords, got {len(records)}")
        x = torch.tensor([[1.0, r.num_prefill_tokens, r.num_decode_tokens, r.num_kv_blocks_used] for r in records],
                         dtype=torch.float64)
        y = torch.tensor([[r.end_time - r.start_time] for r in records], dtype=torch.float64)
        active = list(range(len(FEATURES)))
        while True:
            coef = torch.linalg.lstsq(x[:, active], y, driver="gelsd").solution.flatten()
            worst = int(coef[1:].argmin()) + 1 if len(active) > 1 else 0
            if worst == 0 or coef[worst] >= 0:
                break
            del active[worst]
        values = dict.fromkeys(FEATURES, 0.0) | {FEATURES[i]: float(c) for i, c in zip(active, coef, strict=True)}
        return cls(**values)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        try:
            return cls(**json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"model.cost_model: cannot read a cost model from {path}: {exc}") from exc


class ProfiledEngine(Protocol):
    """What profiling needs of an engine (LLMEngine; passed in, since the engine is built on runners)."""

    max_model_len: int
    vocab_size: int
    batch_records: list[BatchRecord]

    def add_request(self, prompt: list[int], params: SamplingParams) -> str: ...

    def step(self) -> list: ...

    def has_unfinished(self) -> bool: ...


def profile_cost_model(config: EngineConfig, make_engine: Callable[[EngineConfig], ProfiledEngine],
                       num_requests: int = 12, seed: int = 0) -> CostModel:
    """Fit a cost model on the real runner of ``config``'s model: prompts of varied lengths, run under
    ``vllm`` (prefill-only and decode-only iterations) and ``sarathi`` (hybrid ones) on engines from
    ``make_engine``. Cached as JSON in the preset cache folder, keyed by everything that changes
    iteration times."""
    mc, cc = config.model, config.cache
    key = [COST_MODEL_VERSION, mc.model, mc.dtype, mc.device, mc.attention_backend, cc.block_size,
           torch.get_num_threads(), seed]
    path = cache_root() / "cost_models" / (hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16] + ".json")
    if path.is_file():
        return CostModel.load(path)
    rng = random.Random(seed)
    records: list[BatchRecord] = []
    for policy in ("vllm", "sarathi"):
        real = replace(config, model=replace(mc, runner="model"),
                       scheduler=replace(config.scheduler, policy=policy, chunk_size=128))
        engine = make_engine(real)
        limit = min(1024, engine.max_model_len // 2)
        vocab = engine.vocab_size
        for _ in range(num_requests):
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(16, limit))]
            engine.add_request(prompt, SamplingParams(max_tokens=rng.randint(8, 48), ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        records += engine.batch_records[2:]  # the first iterations carry one-off warm-up costs
    model = CostModel.fit(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    return model
