"""Copy the GPU operator profiles the simulator's cost model uses out of a clone of microsoft/vidur
(MIT), trimmed to the columns it reads, gzip CSV, into ``engine/simulator/ops/profiles/``, and write
``sources.json``: for every vendored file its repository, commit, original path and kept columns.

    python -m benchmarks.vendor_vidur_profiles --repo /path/to/vidur/clone

Times stay in Vidur's unit (milliseconds). Exact duplicate rows are dropped (as Vidur's own loader does).
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import subprocess
from pathlib import Path

import pandas as pd

REPOSITORY = "https://github.com/microsoft/vidur"
HEAD = "7d47513363ec447a741ac5e47241580b47724fbf"   # newest snapshot: the per-model compute and network profiles
OLD = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"    # the older single-file profiles: A100 attention, A40 all-reduce
CPU = "6d98aa8f71696520acc603d87439e77cc78160a7"    # the last CPU-overhead profiles, batch 8 to 128
OUT = Path(__file__).resolve().parents[1] / "engine" / "simulator" / "ops" / "profiles"

MODEL_COLUMNS = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]
COMPUTE_OPS = ["emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
               "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]
COMPUTE_MODELS = {
    "a100": ["Qwen/Qwen-72B", "codellama/CodeLlama-34b-Instruct-hf", "internlm/internlm-20b",
             "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-70B",
             "meta-llama/Meta-Llama-3-8B", "microsoft/phi-2"],
    "h100": ["Qwen/Qwen-72B", "codellama/CodeLlama-34b-Instruct-hf", "internlm/internlm-20b",
             "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf", "microsoft/phi-2"],
    "a40": ["Qwen/Qwen-72B", "codellama/CodeLlama-34b-Instruct-hf", "internlm/internlm-20b",
            "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf", "microsoft/phi-2"],
}
NETWORK_COLUMNS = ["num_workers", "devices_per_node", "size"]
# (vendored name, commit, original path, collective)
NETWORK_FILES = [
    (f"network/{fabric}/{op}.csv.gz", HEAD, f"data/profiling/network/{fabric}/{op}.csv", op)
    for fabric in ("a100_pairwise_nvlink", "a100_dgx", "h100_pairwise_nvlink", "h100_dgx")
    for op in ("all_reduce", "send_recv")
] + [
    ("network/a40_pairwise_nvlink/send_recv.csv.gz", HEAD, "data/profiling/network/a40_pairwise_nvlink/send_recv.csv",
     "send_recv"),
    ("network/a40/all_reduce.csv.gz", OLD, "data/profiling/a40/all_reduce.csv", "all_reduce"),
]
ATTENTION_COLUMNS = ["n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers", "batch_size",
                     "prefill_chunk_size", "kv_cache_size", "is_prefill",
                     "time_stats.attn_prefill.median", "time_stats.attn_decode.median"]
CPU_COLUMNS = ["model_name", "batch_size", "tensor_parallel_degree", "schedule_median", "sampler_e2e_median",
               "prepare_inputs_e2e_median", "process_model_outputs_median"]


def read(repo: Path, commit: str, path: str) -> pd.DataFrame:
    text = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout
    return pd.read_csv(io.StringIO(text)).drop_duplicates()


def write(frame: pd.DataFrame, name: str, commit: str, path: str, sources: list[dict]) -> None:
    target = OUT / name
    target.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same input gives the same bytes
    with gzip.GzipFile(target, "wb", mtime=0) as f:
        f.write(frame.to_csv(index=False, float_format="%.6g").encode())
    sources.append({"file": name, "repository": REPOSITORY, "commit": commit, "path": path,
                    "columns": list(frame.columns), "rows": len(frame)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, required=True, help="a clone of microsoft/vidur (bare or not) with its history")
    args = ap.parse_args()
    sources: list[dict] = []
    for gpu, models in COMPUTE_MODELS.items():
        for model in models:
            path = f"data/profiling/compute/{gpu}/{model}/mlp.csv"
            frame = read(args.repo, HEAD, path)
            # phi-2 (parallel attention and MLP) has no post_attention_layernorm column
            columns = [c for op in COMPUTE_OPS if (c := f"time_stats.{op}.median") in frame.columns]
            frame = frame[["num_tokens", "num_tensor_parallel_workers", *columns, *MODEL_COLUMNS]]
            write(frame, f"compute/{gpu}/{model.split('/')[1]}.csv.gz", HEAD, path, sources)
    for name, commit, path, op in NETWORK_FILES:
        frame = read(args.repo, commit, path)
        frame = frame[frame["collective"] == op][[*NETWORK_COLUMNS, f"time_stats.{op}.median"]]
        write(frame, name, commit, path, sources)
    path = "data/profiling/a100/attention.csv"
    write(read(args.repo, OLD, path)[ATTENTION_COLUMNS], "attention/a100.csv.gz", OLD, path, sources)
    for gpu in ("a100", "a40"):
        path = f"data/profiling/{gpu}/cpu_overheads.csv"
        write(read(args.repo, CPU, path)[CPU_COLUMNS], f"cpu_overhead/{gpu}.csv.gz", CPU, path, sources)
    (OUT / "sources.json").write_text(json.dumps(sources, indent=1) + "\n")
    print(f"{len(sources)} files, {sum(p.stat().st_size for p in OUT.rglob('*.gz')) / 1e6:.2f} MB -> {OUT}")


if __name__ == "__main__":
    main()
