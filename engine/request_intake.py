"""A request checked before the engine queues it: its prompt as token ids, its parameters, its id and its KV
budget, each refused with a ValueError naming the problem."""
from __future__ import annotations

from typing import Any

from stallfree.engine.request import Request, SamplingParams
from stallfree.engine.request_limits import check_context_length, check_kv_budget, check_prompt_ids
from stallfree.engine.tokenizer import prompt_token_ids


def checked_request(engine: Any, prompt: str | list[int], params: SamplingParams | None, request_id: str,
                    arrival_time: float | None) -> Request:
    """The Request ``engine`` (an LLMEngine: this module is below it) would queue, or ValueError; nothing changes
    in the engine either way."""
    params = params or SamplingParams()
    params.validate()
    token_ids = prompt_token_ids(prompt, engine.tokenizer, engine.no_tokenizer_reason)
    check_prompt_ids(token_ids, engine.vocab_size)
    check_context_length(len(token_ids), None, engine.max_model_len)
    if (params.logprobs is not None or params.prompt_logprobs is not None) and not engine.batches.computes_logits:
        raise ValueError("logprobs and prompt_logprobs need a runner that computes logits (runner=model)")
    if request_id in engine.scheduler.requests or (engine.remote_prefill is not None
                                                   and request_id in engine.remote_prefill):
        raise ValueError(f"duplicate request_id {request_id!r}")
    request = Request(request_id, token_ids, params,
                      engine.clock() if arrival_time is None else arrival_time, engine.max_model_len)
    check_kv_budget(request.max_num_tokens, engine.kv, engine.device.type == "cuda")
    return request
