// Decode attention read in place from the paged KV cache: one query token per sequence, no gather copy.
//
// Cache layout (see SDPAAttention): [num_kv_heads, num_blocks, block_size, head_dim]. One task per
// (sequence, kv head) computes all query heads of its GQA group, so every key/value row is loaded and
// converted to fp32 once per group. Built by engine/attention/native.py with -fopenmp; the OpenMP
// runtime is the one torch already loaded (same soname), so threads are shared, not doubled.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline float load(float x) { return x; }
inline float load(uint16_t bf16) {
  uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline void store(float* dst, float x) { *dst = x; }
inline void store(uint16_t* dst, float x) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFF + ((bits >> 16) & 1);
  *dst = static_cast<uint16_t>(bits >> 16);
}

// D is a compile-time constant so the per-row dot products unroll into a few full-width FMAs.
template <typename T, int D>
void paged_decode(const T* __restrict q, int64_t q_seq_stride, int64_t q_head_stride, const T* __restrict k_cache,
                  const T* __restrict v_cache, const int64_t* block_tables, int64_t max_blocks,
                  const int64_t* seq_lens, T* __restrict out, int64_t num_seqs, int64_t num_heads,
                  int64_t num_kv_heads, int64_t num_blocks, int64_t block_size, float scale, int num_threads) {
  const int64_t group = num_heads / num_kv_heads;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic)
  for (int64_t task = 0; task < num_seqs * num_kv_heads; ++task) {
    const int64_t s = task / num_kv_heads, kvh = task % num_kv_heads;
    const int64_t len = seq_lens[s];
    const int64_t* table = block_tables + s * max_blocks;
    const int64_t head_offset = kvh * num_blocks * block_size * D;
    std::vector<float> q_buf(group * D), score_buf(group * len), acc_buf(group * D, 0.0f);
    float* __restrict qf = q_buf.data();
    float* __restrict scores = score_buf.data();
    float* __restrict acc = acc_buf.data();
    alignas(64) float row[D];

    for (int64_t g = 0; g < group; ++g) {
      const T* qh = q + s * q_seq_stride + (kvh * group + g) * q_head_stride;
      for (int d = 0; d < D; ++d) qf[g * D + d] = load(qh[d]) * scale;
    }
    for (int64_t t0 = 0, b = 0; t0 < len; t0 += block_size, ++b) {
      const T* block = k_cache + head_offset + table[b] * block_size * D;
      for (int64_t r = 0, rows = std::min(block_size, len - t0); r < rows; ++r) {
        for (int d = 0; d < D; ++d) row[d] = load(block[r * D + d]);
        for (int64_t g = 0; g < group; ++g) {
          float dot = 0.0f;
          for (int d = 0; d < D; ++d) dot += qf[g * D + d] * row[d];
          scores[g * len + t0 + r] = dot;
        }
      }
    }
    std::vector<float> inv_sum(group);
    for (int64_t g = 0; g < group; ++g) {
      float* sg = scores + g * len;
      const float mx = *std::max_element(sg, sg + len);
      float sum = 0.0f;
      for (int64_t t = 0; t < len; ++t) {
        sg[t] = std::exp(sg[t] - mx);
        sum += sg[t];
      }
      inv_sum[g] = 1.0f / sum;
    }
    for (int64_t t0 = 0, b = 0; t0 < len; t0 += block_size, ++b) {
      const T* block = v_cache + head_offset + table[b] * block_size * D;
      for (int64_t r = 0, rows = std::min(block_size, len - t0); r < rows; ++r) {
        for (int d = 0; d < D; ++d) row[d] = load(block[r * D + d]);
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * len + t0 + r];
          for (int d = 0; d < D; ++d) acc[g * D + d] += p * row[d];
        }
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      T* o = out + (s * num_heads + kvh * group + g) * D;
      for (int d = 0; d < D; ++d) store(o + d, acc[g * D + d] * inv_sum[g]);
    }
  }
}

}  // namespace

// Returns 0, or 1 when head_dim has no instantiation (keep in sync with HEAD_DIMS in native.py).
#define DEFINE_PAGED_DECODE(NAME, T)                                                                         \
  extern "C" int NAME(const T* q, int64_t q_seq_stride, int64_t q_head_stride, const T* k_cache,            \
                      const T* v_cache, const int64_t* block_tables, int64_t max_blocks,                    \
                      const int64_t* seq_lens, T* out, int64_t num_seqs, int64_t num_heads,                 \
                      int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,       \
                      float scale, int num_threads) {                                                       \
    switch (head_dim) {                                                                                     \
      HEAD_DIM_CASE(T, 16) HEAD_DIM_CASE(T, 32) HEAD_DIM_CASE(T, 64) HEAD_DIM_CASE(T, 80)                   \
      HEAD_DIM_CASE(T, 96) HEAD_DIM_CASE(T, 128) HEAD_DIM_CASE(T, 256)                                      \
      default: return 1;                                                                                    \
    }                                                                                                       \
  }

#define HEAD_DIM_CASE(T, D)                                                                                 \
  case D:                                                                                                   \
    paged_decode<T, D>(q, q_seq_stride, q_head_stride, k_cache, v_cache, block_tables, max_blocks, seq_lens, \
                       out, num_seqs, num_heads, num_kv_heads, num_blocks, block_size, scale, num_threads);  \
    return 0;

DEFINE_PAGED_DECODE(paged_decode_bf16, uint16_t)
DEFINE_PAGED_DECODE(paged_decode_f32, float)
