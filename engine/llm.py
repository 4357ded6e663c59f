"""Offline API in vLLM's shape: ``LLM(model=..., scheduler=...).generate(prompts, params)``."""
from __future__ import annotations

from engine.engine import LLMEngine
from engine.outputs import RequestOutput
from engine.request import SamplingParams


class LLM:
    def __init__(self, model: str = "tiny", **kwargs):
        self.engine = LLMEngine.from_kwargs(model=model, **kwargs)

    def generate(self, prompts: str | list[int] | list[str | list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        ids = [self.engine.add_request(p, sp or SamplingParams()) for p, sp in zip(prompts, params, strict=True)]
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]
