"""Offline API in vLLM's shape: ``LLM(model=..., scheduler=...).generate(prompts, params)``."""
from __future__ import annotations

from stallfree.engine.engine import LLMEngine
from stallfree.engine.outputs import RequestOutput
from stallfree.engine.request import SamplingParams


class LLM:
    def __init__(self, model: str = "tiny", **kwargs):
        self.engine = LLMEngine.from_kwargs(model=model, **kwargs)

    def generate(self, prompts: str | list[int] | list[str | list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """One output per prompt, in order. A bad prompt or parameter raises ValueError naming it (and
        queues nothing); a request a step failed on ends with finish_reason "error" and its ``error``,
        and the others run on."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        ids: list[str] = []
        try:
            for prompt, sp in zip(prompts, params, strict=True):
                ids.append(self.engine.add_request(prompt, sp or SamplingParams()))
        except ValueError:  # one bad prompt or parameter: nothing of this call is left in the engine
            for request_id in ids:
                self.engine.abort(request_id)
            raise
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]
