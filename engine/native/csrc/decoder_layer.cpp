// One Llama-family decoder layer in one call: the kernels the layer's modules call (engine/model/llama.py with
// TiledLinear, the native layer ops and the cpu_paged attention backend), in the same order on the same buffers,
// so the outputs are the same bits.
//
// Why: between two kernels, the modules' Python (module calls, views, allocations, ctypes arguments) took
// 14-30 us, 3x what the same code takes when no kernel runs between (a decode step's weights and cache have
// just gone through the caches). At batch 32 that was 2.2 ms of a 24.4 ms `small` decode step on a 2-core
// Xeon (docs/performance.md).
#include <cstdint>
#include <cstring>

#include "layer_kernels.h"

// A layer's shapes and weights, fixed at load (FusedLayerArgs in engine/model/fused_layers.py).
struct LayerArgs {
  int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate;
  float eps;
  const uint16_t *input_norm, *post_norm;
  const uint16_t *qkv, *qkv_bias, *o, *gate_up, *down;  // tile-packed (linear_tiled.h); gate_up: [gate | up] with SiLU-and-mul
};

// One forward pass: its tokens, attention metadata and scratch, the same for every layer (FusedStepArgs).
struct StepArgs {
  int64_t tokens;
  const uint16_t *cos, *sin;  // [tokens, head_dim]
  const int64_t *slot_mapping, *block_tables, *query_start_loc, *seq_lens;
  int64_t table_stride, num_seqs, num_blocks, block_size;
  float scale;
  uint16_t *qkv, *attn, *act;  // [tokens, q + 2 kv], [tokens, q], [tokens, intermediate]
  int num_threads;
};

// The layer in two halves, split where tensor parallelism all-reduces (engine/model/fused_layers.py): each
// ends with a row-parallel projection whose output in x is, on a rank of a TP group, a partial sum.
//
// Attention: x is the previous layer's output, or for the first layer (first = 1) the embeddings; residual the
// residual stream before x (unset for the first layer). Afterwards x holds o_proj's output and residual the
// stream before it.
extern "C" int decoder_layer_attention_bf16(const LayerArgs* l, const StepArgs* s, uint16_t* x, uint16_t* residual,
                                            uint16_t* k_cache, uint16_t* v_cache, int first) {
  const int64_t T = s->tokens, D = l->head_dim, q_size = l->num_heads * D, kv_size = l->num_kv_heads * D;
  const int64_t width = q_size + 2 * kv_size;
  const int threads = s->num_threads;
  uint16_t *q = s->qkv, *k = s->qkv + q_size, *v = s->qkv + q_size + kv_size;
  if (first) std::memcpy(residual, x, T * l->hidden * sizeof(uint16_t));
  rms_norm_bf16(x, l->hidden, residual, x, l->input_norm, T, l->hidden, l->eps, !first, threads);
  linear_tiled_bf16(x, T, l->hidden, l->qkv, width, l->qkv_bias, 0, s->qkv, threads);
  rotary_bf16(q, width, l->num_heads, k, width, l->num_kv_heads, s->cos, s->sin, T, D, threads);
  write_cache_bf16(k, width, v, width, k_cache, v_cache, s->slot_mapping, T, l->num_kv_heads, D, s->num_blocks,
                   s->block_size, threads);
  if (paged_attention_bf16(q, width, D, k_cache, v_cache, s->block_tables, s->table_stride, s->query_start_loc,
                           s->seq_lens, s->num_seqs, s->attn, l->num_heads, l->num_kv_heads, D, s->num_blocks,
                           s->block_size, s->scale, threads) != 0)
    return 1;
  return linear_tiled_bf16(s->attn, T, q_size, l->o, l->hidden, nullptr, 0, x, threads);
}

// MLP: x is (the all-reduced) o_proj output. Afterwards x holds down_proj's output and residual the stream
// before it: the next layer's norm adds them, as DecoderLayer.forward returns them.
extern "C" int decoder_layer_mlp_bf16(const LayerArgs* l, const StepArgs* s, uint16_t* x, uint16_t* residual) {
  const int64_t T = s->tokens;
  const int threads = s->num_threads;
  rms_norm_bf16(x, l->hidden, residual, x, l->post_norm, T, l->hidden, l->eps, 1, threads);
  linear_tiled_bf16(x, T, l->hidden, l->gate_up, 2 * l->intermediate, nullptr, 1, s->act, threads);
  return linear_tiled_bf16(s->act, T, l->intermediate, l->down, l->hidden, nullptr, 0, x, threads);
}

// The whole layer in one call, where no all-reduce sits between the halves.
extern "C" int decoder_layer_bf16(const LayerArgs* l, const StepArgs* s, uint16_t* x, uint16_t* residual,
                                  uint16_t* k_cache, uint16_t* v_cache, int first) {
  if (decoder_layer_attention_bf16(l, s, x, residual, k_cache, v_cache, first) != 0) return 1;
  return decoder_layer_mlp_bf16(l, s, x, residual);
}
