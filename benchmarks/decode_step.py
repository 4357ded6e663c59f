"""Where a decode step's time goes, in process: one batch of ``--batch`` requests decoding after
``--prompt-len``-token prompts, with the model's parts wrapped in wall-clock timers (linears, lm_head,
attention kernel, cache write, the fused element-wise ops, the whole forward pass and the engine step).
Figures are ms per step, the mean over ``--steps`` steps. The parts are timed where they are modules: a
model whose layers run as one native call each (engine/model/fused_layers.py) runs its modules here, so
``forward`` is the modules' time, not the fused layers'.

    python -m benchmarks.decode_step [--model small] [--batch 32] [--out benchmarks/results/decode_step.json]
"""
from __future__ import annotations

import argparse
import collections
import time

from benchmarks.engine_throughput import make_prompts, write_result
from stallfree.engine import LLM, SamplingParams
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.presets import resolve_model_path


def timed(totals: dict, part: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        totals[part] += time.perf_counter() - start
        return out
    return wrapper


def instrument(llm: LLM) -> dict:
    """Wrap the parts of ``llm``'s model and engine in timers; returns the totals they add to (seconds)."""
    totals: dict = collections.defaultdict(float)
    runner, model = llm.engine.runner, llm.engine.runner.model
    if hasattr(model, "fused"):
        model.fused = False
    backend = runner.attn_backend
    for name in ("attention", "write_cache"):
        if hasattr(backend, name):  # the native CPU backend's two kernels
            setattr(backend, name, timed(totals, name, getattr(backend, name)))
    for layer in model.layers:
        for part, module in (("norm", layer.input_layernorm), ("norm", layer.post_attention_layernorm),
                             ("rotary", layer.self_attn.rotary), ("silu_and_mul", layer.mlp.act),
                             ("linears", layer.self_attn.qkv_proj), ("linears", layer.self_attn.o_proj),
                             ("linears", layer.mlp.gate_up_proj), ("linears", layer.mlp.down_proj)):
            module.forward = timed(totals, part, module.forward)
    model.lm_head.forward = timed(totals, "lm_head", model.lm_head.forward)
    model.forward = timed(totals, "forward", model.forward)
    llm.engine.step = timed(totals, "step", llm.engine.step)
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/decode_step.json")
    args = ap.parse_args()
    llm = LLM(args.model, scheduler="sarathi", chunk_size=512, dtype=args.dtype)
    engine = llm.engine
    vocab = ArchConfig.from_dir(resolve_model_path(args.model)).vocab_size
    params = SamplingParams(max_tokens=args.steps + 64, temperature=0.0, ignore_eos=True)
    for prompt in make_prompts(args.batch, args.prompt_len, vocab):
        engine.add_request(prompt, params)
    while not engine.batch_records or engine.batch_records[-1].num_prefill_tokens:  # prefill every prompt
        engine.step()
    for _ in range(3):  # warm-up decode steps
        engine.step()
    totals = instrument(llm)
    for _ in range(args.steps):
        engine.step()
    assert engine.batch_records[-1].num_decode_seqs == args.batch
    result: dict = {"model": args.model, "dtype": str(engine.dtype), "batch": args.batch, "prompt_len": args.prompt_len,
                    "steps": args.steps, "attention_backend": type(engine.runner.attn_backend).__name__}
    result.update({f"{part}_ms": 1e3 * total / args.steps for part, total in totals.items()})
    write_result(result, args.out)


if __name__ == "__main__":
    main()
