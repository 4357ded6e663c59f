"""Parts of ``benchmarks/gpu.py``: random HF checkpoints, the greedy check against HF transformers, and
the targets of the GPU work with their PASS / FAIL verdicts."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from stallfree.engine import LLM, SamplingParams

# A small model with the 7B's attention layout (GQA 4:1, head_dim 128) for the greedy check on the GPU.
CHECK_SHAPE = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=1, vocab_size=4096, max_position_embeddings=1024)
SMOKE_SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=2048, max_position_embeddings=8192)
CHECK_PROMPT_LENS = (1, 7, 33, 64, 130, 300)  # prompts shorter and longer than a chunk, arriving together
CHECK_MAX_TOKENS = 16

# (name in the figures, comparison, limit): the targets the GPU engine is built to meet.
TARGETS = (
    ("decode_b1_ms", "<=", 6.0),
    ("decode_b64_ms", "<=", 9.0),
    ("hybrid_over_prefill_512", "<=", 1.3),
    ("prefill_512_mfu", ">=", 0.5),
    ("prefill_4096_mfu", ">=", 0.65),
    ("offline_sarathi_over_vllm", ">=", 0.9),
    ("offline_sarathi_over_hf_continuous_batching", ">=", 2.0),
)


def write_checkpoint(shape: dict, path: Path, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Path:
    """An HF-format Llama directory (config + random weights, no tokenizer), drawn on ``device``."""
    torch.manual_seed(seed)
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = shape["num_key_value_heads"] * h // shape["num_attention_heads"]

    def linear(out_dim: int, in_dim: int) -> torch.Tensor:
        return (torch.randn(out_dim, in_dim, device=device) / in_dim ** 0.5).to(dtype).cpu()

    w = {"model.embed_tokens.weight": torch.randn(shape["vocab_size"], h, device=device).to(dtype).cpu(),
         "model.norm.weight": torch.ones(h, dtype=dtype), "lm_head.weight": linear(shape["vocab_size"], h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": linear(h, h), p + "self_attn.k_proj.weight": linear(kv, h),
              p + "self_attn.v_proj.weight": linear(kv, h), p + "self_attn.o_proj.weight": linear(h, h),
              p + "mlp.gate_proj.weight": linear(inter, h), p + "mlp.up_proj.weight": linear(inter, h),
              p + "mlp.down_proj.weight": linear(h, inter),
              p + "input_layernorm.weight": torch.ones(h, dtype=dtype),
              p + "post_attention_layernorm.weight": torch.ones(h, dtype=dtype)}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1,
              "eos_token_id": 2, "torch_dtype": str(dtype).removeprefix("torch."), **shape}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(w, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def hf_greedy(path: Path, prompts: list[list[int]], max_tokens: int, device: torch.device,
              dtype: torch.dtype) -> list[list[int]]:
    """HF transformers' greedy tokens for each prompt (one at a time, EOS ignored)."""
    from transformers import AutoModelForCausalLM, GenerationConfig
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    config = GenerationConfig(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    outs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt], device=device), generation_config=config)
            outs.append(ids[0, len(prompt):].tolist())
    return outs


def check_prompts(path: Path) -> list[list[int]]:
    """The greedy checks' prompts (CHECK_PROMPT_LENS long), drawn from the checkpoint's vocabulary."""
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in CHECK_PROMPT_LENS]


def greedy_check(path: Path, device: torch.device, dtype: torch.dtype, engine_kwargs: dict) -> dict:
    """The engine's greedy tokens against HF's on the same weights, prompts arriving together (sarathi,
    chunk 64: hybrid steps, then decode-only steps of shrinking batches through the graphs)."""
    prompts = check_prompts(path)
    llm = LLM(str(path), scheduler="sarathi", chunk_size=64, max_num_seqs=8, max_model_len=512, **engine_kwargs)
    params = SamplingParams(max_tokens=CHECK_MAX_TOKENS, temperature=0.0, ignore_eos=True)
    ours = [o.token_ids for o in llm.generate(prompts, params)]
    graphs = llm.engine.runner.decode_graphs
    replays = sum(graphs.replays.values()) if graphs else 0
    del llm
    theirs = hf_greedy(path, prompts, CHECK_MAX_TOKENS, device, dtype)
    first_diffs = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
                   for x, y in zip(ours, theirs, strict=True)]
    return {"dtype": str(dtype), "equal": ours == theirs, "prompts": len(prompts),
            "prompts_equal": sum(d is None for d in first_diffs), "first_difference_at": first_diffs,
            "graph_replays": replays}


def judge(figures: dict) -> dict:
    """Each target's value, limit and verdict: PASS, FAIL, or SKIP when the figure is missing."""
    verdicts = {}
    for name, op, limit in TARGETS:
        value = figures.get(name)
        ok = None if value is None else (value <= limit if op == "<=" else value >= limit)
        verdicts[name] = {"value": value, "target": f"{op} {limit}",
                          "verdict": "SKIP" if ok is None else "PASS" if ok else "FAIL"}
    return verdicts
