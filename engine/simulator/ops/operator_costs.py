"""``OperatorCostModel``: seconds of each operator of a deployment (GPU, model shape, TP degree,
interconnect), from measured GPU operator profiles (see the modules it composes and ``describe()``).

``build`` turns everything that depends only on the token count (the GEMMs, the memory-bound operators
and the TP all-reduce of a layer; the embedding; the final norm and LM head) into per-token-count
tables, so ``stage_seconds`` is a few table lookups plus one term per prefill chunk.
"""
from __future__ import annotations

from dataclasses import asdict

from stallfree.engine.simulator.hardware import GPUS
from stallfree.engine.simulator.ops import profile_data
from stallfree.engine.simulator.ops.attention import PROFILE as ATTENTION_PROFILE
from stallfree.engine.simulator.ops.attention import AttentionModel, profile_fit
from stallfree.engine.simulator.ops.batch import StageBatch
from stallfree.engine.simulator.ops.comm import CommModel
from stallfree.engine.simulator.ops.cpu_overhead import CpuOverheadModel
from stallfree.engine.simulator.ops.cpu_overhead import profile_file as cpu_profile_file
from stallfree.engine.simulator.ops.elementwise import elementwise_models, shape_widths
from stallfree.engine.simulator.ops.linear import gemm_model, shape_gemms
from stallfree.engine.simulator.shapes import ModelShape

TABLE_TOKENS = 4096  # the profiles' common range; beyond it, token counts are split into pieces of this size
PROFILED_GPU = {"a100": "a100", "a40": "a40", "h100": "h100", "h200": "h100"}
TOKEN_OPS = ("qkv_proj", "o_proj", "mlp_up_gate", "mlp_act", "mlp_down", "norms", "rotary", "residual",
             "tp_all_reduce")
LINEAR_OPS = ("qkv_proj", "o_proj", "mlp_up_gate", "mlp_down")  # the GEMMs of a layer (the operator split's "linear")
# memory-bound operator -> (its table, how many a layer runs; the embedding runs once, on the first stage)
PER_LAYER = {"norm": ("norms", 2), "rotary": ("rotary", 1), "mlp_act": ("mlp_act", 1), "residual": ("residual", 2),
             "embedding": ("embedding", 1)}
SHOWN_TOKENS = (1, 8, 64, 128, 136, 256, 512, 1024, 2048, 4096)

ASSUMPTIONS = (
    "Calibrated only on operator profiles (Vidur's), never on end-to-end serving results.",
    "GEMMs: each profiled (model, TP, operator) is a curve of time vs token count with GEMM shape (k, n); an "
    "unprofiled (k, n) takes, at every profiled token count, the inverse-squared-distance-weighted geometric mean "
    "of the time per weight of the 4 nearest profiled shapes in (log k, log n) (distance floor 0.05), times its "
    "own k x n: an interpolated efficiency surface, fitted per GPU on all its profiled models.",
    "Token counts between two profiled ones take the time of the next profiled count (tile steps kept); counts "
    f"above {TABLE_TOKENS} are split into {TABLE_TOKENS}-token pieces whose times add.",
    "Memory-bound operators (norms, rotary, activation, residual add, embedding) are interpolated the same way in "
    "their width (elements per token).",
    "A layer: QKV, rotary, attention, output projection, MLP up/gate, activation, MLP down; 2 norms and 2 residual "
    "adds; 2 TP all-reduces of tokens x hidden (1 when attention and MLP run in parallel, as Falcon's). Falcon-180B "
    "has 2 norms per layer (ln_attn and ln_mlp) as well.",
    "Megatron TP sharding: QKV and up/gate split by columns, output and down projections by rows; norms, "
    "residual adds and the embedding width are not split; at least 1 KV head per GPU.",
    "Attention: fitted on Vidur's A100 FlashAttention profile (LLaMA2-70B TP2); prefill = launch + per-token + "
    "chunk x cache FLOPs / F_cross + causal chunk FLOPs / F_causal, decode = launch + K/V bytes read / B. Other "
    "GPUs: the same fractions of their published bf16 peak (prefill) and bandwidth (decode); other head counts "
    "scale the work terms (FlashAttention efficiency at head_dim 64 assumed equal to 128).",
    "TP all-reduce and PP send/recv from Vidur's NCCL profiles by message size, tokens x hidden x 2 bytes; "
    "a PP send carries the hidden states only, each TP rank sending its copy in parallel.",
    "First stage adds the embedding; last stage adds the final norm over all tokens and the LM head GEMM over one "
    "token per sequence (decodes and every prefill chunk: an upper bound, as only a prompt's last chunk samples).",
    "KV-cache writes are not modelled separately (memory-bound, small next to the profiled operators).",
    "CPU overhead per iteration: schedule + prepare inputs + sampler + process outputs medians of Vidur's vLLM "
    "profile, a + b x sequences at the deployment's TP (nearest profiled TP below); Ray messaging left out; "
    "H100/H200 deployments use the A100 host's profile.",
    "H200: H100 operator and network profiles (same GH100 compute and NVLink); its higher bandwidth only speeds "
    "decode attention here, so its memory-bound small-batch GEMMs are conservative.",
    "Vidur profiled in fp16; bf16 runs on the same tensor cores at the same rate.",
)


class OperatorCostModel:
    """Seconds of each named operator for a deployment's GPU, model shape, TP degree and interconnect."""

    def __init__(self, gpu: str, shape: ModelShape, tp: int, interconnect: str):
        if gpu not in GPUS:
            raise ValueError(f"gpu: unknown {gpu!r}; have {sorted(GPUS)}")
        if not isinstance(shape, ModelShape):
            raise ValueError(f"shape: expected a ModelShape, got {type(shape).__name__}")
        if tp < 1 or shape.num_heads % tp or shape.intermediate_size % tp:
            raise ValueError(f"tp: {tp} does not divide {shape.name}'s {shape.num_heads} heads and "
                             f"{shape.intermediate_size} FFN width")
        self.gpu, self.shape, self.tp, self.interconnect = gpu, shape, tp, interconnect
        self.profiled_gpu = PROFILED_GPU[gpu]
        self.comm = CommModel.build(gpu, interconnect, tp, shape.hidden_size)
        self.attention = AttentionModel.build(GPUS[gpu], shape.num_heads // tp, max(1, shape.num_kv_heads // tp),
                                              shape.head_dim)
        self.cpu = CpuOverheadModel.build(gpu, tp)
        gemms, elementwise = gemm_model(self.profiled_gpu), elementwise_models(self.profiled_gpu)
        self._gemm_neighbours = {op: [(round(w, 3), c.source) for w, c in gemms.nearest(kn)]
                                 for op, kn in shape_gemms(shape, tp).items()}
        self.tables = {op: gemms.table(kn, TABLE_TOKENS) for op, kn in shape_gemms(shape, tp).items()}
        widths = shape_widths(shape, tp)
        for op, model in elementwise.items():
            name, count = PER_LAYER[op]
            self.tables[name] = [count * s for s in model.table((widths[op],), TABLE_TOKENS)]
        self.tables["final_norm"] = [s / 2 for s in self.tables["norms"]]
        self.tables["lm_head"] = gemms.table((shape.hidden_size, shape.vocab_size // tp), TABLE_TOKENS)
        reduces = 1 if shape.parallel_attn_mlp else 2
        self.tables["tp_all_reduce"] = [reduces * self.comm.all_reduce_seconds(m) for m in range(TABLE_TOKENS + 1)]
        self._layer = [sum(v) for v in zip(*(self.tables[op] for op in TOKEN_OPS), strict=True)]
        self._last_batch: StageBatch | None = None
        self._last_layer = 0.0

    @classmethod
    def build(cls, gpu: str, shape: ModelShape, tp: int, interconnect: str) -> OperatorCostModel:
        return cls(gpu, shape, tp, interconnect)

    @staticmethod
    def _at(table: list[float], num_tokens: int) -> float:
        if num_tokens <= TABLE_TOKENS:
            return table[num_tokens]
        pieces, rest = divmod(num_tokens, TABLE_TOKENS)
        return pieces * table[TABLE_TOKENS] + table[rest]

    def layer_seconds(self, batch: StageBatch) -> dict[str, float]:
        """One transformer layer on one GPU of the TP group, by operator."""
        m = batch.num_tokens
        out = {op: self._at(self.tables[op], m) for op in TOKEN_OPS}
        out["attn_prefill"] = self.attention.prefill_seconds(batch.prefill_chunks)
        out["attn_decode"] = self.attention.decode_seconds(len(batch.decode_contexts), batch.decode_context_tokens)
        return out

    def stage_seconds(self, batch: StageBatch, num_layers: int, *, first: bool, last: bool) -> float:
        """A pipeline stage of ``num_layers`` layers (+ embedding if first, + final norm and LM head if last),
        excluding the PP send of its output."""
        m = batch.num_tokens
        if batch is not self._last_batch:  # every stage of a micro-batch asks for the same layer time
            attention = self.attention
            self._last_layer = (self._at(self._layer, m) + attention.prefill_seconds(batch.prefill_chunks)
                                + attention.decode_seconds(len(batch.decode_contexts), batch.decode_context_tokens))
            self._last_batch = batch
        total = num_layers * self._last_layer
        if first:
            total += self._at(self.tables["embedding"], m)
        if last:
            total += self._at(self.tables["final_norm"], m) + self._at(self.tables["lm_head"], batch.num_seqs)
        return total

    def split_seconds(self, batch: StageBatch, num_layers: int, *, last: bool) -> tuple[float, float]:
        """(linear, attention) seconds of ``num_layers`` layers (+ the LM head if ``last``): the operator split
        of the stage (the rest of ``stage_seconds`` is element-wise ops and the TP all-reduce)."""
        m = batch.num_tokens
        linear = num_layers * sum(self._at(self.tables[op], m) for op in LINEAR_OPS)
        attention = num_layers * (self.attention.prefill_seconds(batch.prefill_chunks)
                                  + self.attention.decode_seconds(len(batch.decode_contexts), batch.decode_context_tokens))
        return linear + (self._at(self.tables["lm_head"], batch.num_seqs) if last else 0.0), attention

    def pp_send_seconds(self, num_tokens: int) -> float:
        """The activations of ``num_tokens`` tokens to the next stage."""
        return self.comm.send_seconds(num_tokens)

    def cpu_overhead_seconds(self, batch: StageBatch) -> float:
        """Per iteration: scheduling, input preparation, sampling and output processing."""
        return self.cpu.seconds(batch.num_seqs)

    def input_files(self) -> list[str]:
        files = [*profile_data.compute_files(self.profiled_gpu), ATTENTION_PROFILE, cpu_profile_file(self.gpu),
                 self.comm.send_recv.source]
        if self.comm.all_reduce is not None:
            files.append(self.comm.all_reduce.source)
        return files

    def describe(self) -> dict:
        """Provenance: every input file (repository, commit, path), every modelled assumption, the fitted
        parameters and the operator times they give."""
        sources = profile_data.sources()
        shown = [m for m in SHOWN_TOKENS if m <= TABLE_TOKENS]
        return {
            "deployment": {"gpu": asdict(GPUS[self.gpu]), "profiled_gpu": self.profiled_gpu,
                           "shape": asdict(self.shape), "tp": self.tp, "interconnect": self.interconnect},
            "inputs": [{k: sources[f][k] for k in ("repository", "commit", "path")} | {"vendored_as": f}
                       for f in self.input_files()],
            "assumptions": list(ASSUMPTIONS),
            "parameters": {
                "table_tokens": TABLE_TOKENS,
                "gemm_shapes": {op: list(kn) for op, kn in shape_gemms(self.shape, self.tp).items()},
                "gemm_nearest_profiled": self._gemm_neighbours,
                "attention_profile_fit": asdict(profile_fit()),
                "attention": asdict(self.attention),
                "cpu_overhead": asdict(self.cpu),
                "all_reduce_per_layer": 0 if self.tp == 1 else (1 if self.shape.parallel_attn_mlp else 2),
            },
            "operator_seconds_by_tokens": {op: {m: self.tables[op][m] for m in shown}
                                           for op in (*TOKEN_OPS, "embedding", "final_norm", "lm_head")},
            "pp_send_seconds_by_tokens": {m: self.pp_send_seconds(m) for m in shown},
        }
