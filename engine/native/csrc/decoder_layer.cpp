// One Llama-family decoder layer in one call: the kernels the layer's modules call (engine/model/llama.py with
// TiledLinear or WidenedLinear, the native layer ops and the cpu_paged attention backend), in the same order on the
// same buffers, so the outputs are the same bits.
//
// Why: between two kernels, the modules' Python (module calls, views, allocations, ctypes arguments) took
// 14-30 us, 3x what the same code takes when no kernel runs between (a decode step's weights and cache have
// just gone through the caches). At batch 32 that was 2.2 ms of a 24.4 ms `small` decode step on a 2-core
// Xeon (docs/performance.md).
//
// Two kinds of layer: bf16 on the tiled linears (SiLU-and-mul in gate_up's epilogue), and fp32 on the widened
// linears (bf16 weights; SiLU-and-mul a kernel of its own over the gate_up scratch).
#include <cstdint>
#include <cstring>

#include "layer_kernels.h"

// A layer's shapes and weights, fixed at load (FusedLayerArgs in engine/model/fused_layers.py). Norm weights and the
// qkv bias are in the layer's dtype; the linears' weights are bf16, packed (linear_tiled.h).
struct LayerArgs {
  int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate;
  float eps;
  const void *input_norm, *post_norm;
  const uint16_t* qkv;
  const void* qkv_bias;
  const uint16_t *o, *gate_up, *down;  // gate_up: [gate | up]; bf16: with SiLU-and-mul in its panels
};

// One forward pass: its tokens, attention metadata and scratch, the same for every layer (FusedStepArgs).
struct StepArgs {
  int64_t tokens;
  const void *cos, *sin;  // [tokens, head_dim]
  const int64_t *slot_mapping, *block_tables, *query_start_loc, *seq_lens;
  int64_t table_stride, num_seqs, num_blocks, block_size;
  float scale;
  void *qkv, *attn, *act;  // [tokens, q + 2 kv], [tokens, q], [tokens, intermediate]
  int num_threads;
  void* gate_up;  // [tokens, 2 * intermediate]: the fp32 layer's gate_up output (unused in bf16)
};

namespace {

// The kernels of each kind of layer.
struct Bf16Layer {
  using T = uint16_t;
  static constexpr auto norm = rms_norm_bf16;
  static constexpr auto rotary = rotary_bf16;
  static constexpr auto write_cache = write_cache_bf16;
  static constexpr auto attention = paged_attention_bf16;
  static void linear(const T* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, const void* bias, T* y,
                     int threads) {
    linear_tiled_bf16(x, M, K, w, N, static_cast<const T*>(bias), 0, y, threads);
  }
  static void gate_up_act(const LayerArgs* l, const StepArgs* s, const T* x, int threads) {
    linear_tiled_bf16(x, s->tokens, l->hidden, l->gate_up, 2 * l->intermediate, nullptr, 1, s->act, threads);
  }
};

struct WidenedLayer {
  using T = float;
  static constexpr auto norm = rms_norm_f32;
  static constexpr auto rotary = rotary_f32;
  static constexpr auto write_cache = write_cache_f32;
  static constexpr auto attention = paged_attention_f32;
  static void linear(const T* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, const void* bias, T* y,
                     int threads) {
    linear_widened_f32(x, M, K, w, N, static_cast<const T*>(bias), y, threads);
  }
  static void gate_up_act(const LayerArgs* l, const StepArgs* s, const T* x, int threads) {
    T* gate_up = static_cast<T*>(s->gate_up);
    linear_widened_f32(x, s->tokens, l->hidden, l->gate_up, 2 * l->intermediate, nullptr, gate_up, threads);
    silu_and_mul_f32(gate_up, static_cast<T*>(s->act), s->tokens, l->intermediate, threads);
  }
};

// The layer in two halves, split where tensor parallelism all-reduces (engine/model/fused_layers.py): each
// ends with a row-parallel projection whose output in x is, on a rank of a TP group, a partial sum.
//
// Attention: x is the previous layer's output, or for the first layer (first = 1) the embeddings; residual the
// residual stream before x (unset for the first layer). Afterwards x holds o_proj's output and residual the
// stream before it.
template <class Ops, typename T = typename Ops::T>
int attention_half(const LayerArgs* l, const StepArgs* s, T* x, T* residual, T* k_cache, T* v_cache, int first) {
  const int64_t tokens = s->tokens, D = l->head_dim, q_size = l->num_heads * D, kv_size = l->num_kv_heads * D;
  const int64_t width = q_size + 2 * kv_size;
  const int threads = s->num_threads;
  T *q = static_cast<T*>(s->qkv), *k = q + q_size, *v = q + q_size + kv_size, *attn = static_cast<T*>(s->attn);
  if (first) std::memcpy(residual, x, tokens * l->hidden * sizeof(T));
  Ops::norm(x, l->hidden, residual, x, static_cast<const T*>(l->input_norm), tokens, l->hidden, l->eps, !first,
            threads);
  Ops::linear(x, tokens, l->hidden, l->qkv, width, l->qkv_bias, q, threads);
  Ops::rotary(q, width, l->num_heads, k, width, l->num_kv_heads, static_cast<const T*>(s->cos),
              static_cast<const T*>(s->sin), tokens, D, threads);
  Ops::write_cache(k, width, v, width, k_cache, v_cache, s->slot_mapping, tokens, l->num_kv_heads, D, s->num_blocks,
                   s->block_size, threads);
  if (Ops::attention(q, width, D, k_cache, v_cache, s->block_tables, s->table_stride, s->query_start_loc, s->seq_lens,
                     s->num_seqs, attn, l->num_heads, l->num_kv_heads, D, s->num_blocks, s->block_size, s->scale,
                     threads) != 0)
    return 1;
  Ops::linear(attn, tokens, q_size, l->o, l->hidden, nullptr, x, threads);
  return 0;
}

// MLP: x is (the all-reduced) o_proj output. Afterwards x holds down_proj's output and residual the stream
// before it: the next layer's norm adds them, as DecoderLayer.forward returns them.
template <class Ops, typename T = typename Ops::T>
int mlp_half(const LayerArgs* l, const StepArgs* s, T* x, T* residual) {
  const int threads = s->num_threads;
  Ops::norm(x, l->hidden, residual, x, static_cast<const T*>(l->post_norm), s->tokens, l->hidden, l->eps, 1,
            threads);
  Ops::gate_up_act(l, s, x, threads);
  Ops::linear(static_cast<const T*>(s->act), s->tokens, l->intermediate, l->down, l->hidden, nullptr, x, threads);
  return 0;
}

}  // namespace

// Per kind: the two halves, and the whole layer in one call where no all-reduce sits between them.
#define DEFINE_DECODER_LAYER(SUFFIX, OPS, T)                                                                      \
  extern "C" int decoder_layer_attention_##SUFFIX(const LayerArgs* l, const StepArgs* s, T* x, T* residual,     \
                                                  T* k_cache, T* v_cache, int first) {                          \
    return attention_half<OPS>(l, s, x, residual, k_cache, v_cache, first);                                     \
  }                                                                                                              \
  extern "C" int decoder_layer_mlp_##SUFFIX(const LayerArgs* l, const StepArgs* s, T* x, T* residual) {         \
    return mlp_half<OPS>(l, s, x, residual);                                                                     \
  }                                                                                                              \
  extern "C" int decoder_layer_##SUFFIX(const LayerArgs* l, const StepArgs* s, T* x, T* residual, T* k_cache,   \
                                        T* v_cache, int first) {                                                 \
    if (attention_half<OPS>(l, s, x, residual, k_cache, v_cache, first) != 0) return 1;                         \
    return mlp_half<OPS>(l, s, x, residual);                                                                     \
  }

DEFINE_DECODER_LAYER(bf16, Bf16Layer, uint16_t)
DEFINE_DECODER_LAYER(widened_f32, WidenedLayer, float)
