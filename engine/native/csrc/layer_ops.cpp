// The element-wise work of a decoder layer, fused: RMSNorm (with the residual add before it), rotary
// embedding of Q and K in place, and SiLU-and-mul. Eager PyTorch runs these as ~25 separate ops per
// layer, each a pass over memory and a dispatch; on 2 cores that was ~15% of a decode step.
//
// Each kernel rounds where the unfused PyTorch ops round (to the model dtype after every op), so bf16
// results match HF transformers' order of operations; only the fp32 sum of squares is reassociated.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_tiles.h"
#include "layer_kernels.h"

namespace {

using attention_tiles::store_scalar;
using attention_tiles::to_float;

constexpr int64_t PARALLEL_ELEMENTS = 1 << 15;  // below this, a pass costs less than waking the threads

template <typename T>
inline float rounded(float x) {  // x rounded to T, as PyTorch stores every intermediate in the model dtype
  T t;
  store_scalar(&t, x);
  return to_float(t);
}

#if defined(__AVX512F__)
using attention_tiles::load_bf16;
using attention_tiles::rounded_bf16;
using attention_tiles::silu;
using attention_tiles::store_bf16;
#endif

// out = weight * (x / rms(x)) over each row; with add, first residual = x + residual and x is that sum.
template <typename T>
void rms_norm(const T* x, int64_t x_stride, T* residual, T* out, const T* weight, int64_t rows, int64_t dim,
              float eps, bool add, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * dim >= PARALLEL_ELEMENTS)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * x_stride;
    T* res = residual + r * dim;
    T* o = out + r * dim;
#if defined(__AVX512F__)
    // bf16 rows of whole vectors: 4-6x the rate of the loops below, which the compiler leaves scalar
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (dim % 16 == 0) {
        __m512 squares = _mm512_setzero_ps();
        for (int64_t i = 0; i < dim; i += 16) {
          __m512 v = load_bf16(xr + i);
          if (add) {
            v = rounded_bf16(_mm512_add_ps(v, load_bf16(res + i)));
            store_bf16(res + i, v);
          }
          squares = _mm512_fmadd_ps(v, v, squares);
        }
        const T* src = add ? res : xr;
        const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(dim) + eps));
        for (int64_t i = 0; i < dim; i += 16)
          store_bf16(o + i, _mm512_mul_ps(load_bf16(weight + i), rounded_bf16(_mm512_mul_ps(load_bf16(src + i), scale))));
        continue;
      }
    }
#endif
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; ++i) {
      float v = to_float(xr[i]);
      if (add) {
        v = rounded<T>(v + to_float(res[i]));
        store_scalar(res + i, v);
      }
      sum += v * v;
    }
    const T* src = add ? res : xr;
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) store_scalar(o + i, to_float(weight[i]) * rounded<T>(to_float(src[i]) * scale));
  }
}

// Rotary embedding (rotate-half form) of one head in place: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
template <typename T>
inline void rotate_head(T* x, const T* cos, const T* sin, int64_t half) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, uint16_t>) {
    for (; i + 16 <= half; i += 16) {
      const __m512 x1 = load_bf16(x + i), x2 = load_bf16(x + i + half);
      const __m512 c1 = load_bf16(cos + i), s1 = load_bf16(sin + i);
      const __m512 c2 = load_bf16(cos + i + half), s2 = load_bf16(sin + i + half);
      store_bf16(x + i, _mm512_sub_ps(rounded_bf16(_mm512_mul_ps(x1, c1)), rounded_bf16(_mm512_mul_ps(x2, s1))));
      store_bf16(x + i + half, _mm512_add_ps(rounded_bf16(_mm512_mul_ps(x2, c2)), rounded_bf16(_mm512_mul_ps(x1, s2))));
    }
  }
#endif
  for (; i < half; ++i) {
    const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
    const float c1 = to_float(cos[i]), s1 = to_float(sin[i]), c2 = to_float(cos[i + half]), s2 = to_float(sin[i + half]);
    store_scalar(x + i, rounded<T>(x1 * c1) + rounded<T>(-x2 * s1));
    store_scalar(x + i + half, rounded<T>(x2 * c2) + rounded<T>(x1 * s2));
  }
}

// q: [tokens, num_q_heads, head_dim] and k: [tokens, num_k_heads, head_dim] with token strides q_stride,
// k_stride; cos, sin: [tokens, head_dim].
template <typename T>
void rotary(T* q, int64_t q_stride, int64_t num_q_heads, T* k, int64_t k_stride, int64_t num_k_heads,
            const T* cos, const T* sin, int64_t tokens, int64_t head_dim, int num_threads) {
  const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(num_threads) if (tokens * (num_q_heads + num_k_heads) * head_dim >= PARALLEL_ELEMENTS)
  for (int64_t t = 0; t < tokens; ++t) {
    const T* c = cos + t * head_dim;
    const T* s = sin + t * head_dim;
    for (int64_t h = 0; h < num_q_heads; ++h) rotate_head(q + t * q_stride + h * head_dim, c, s, half);
    for (int64_t h = 0; h < num_k_heads; ++h) rotate_head(k + t * k_stride + h * head_dim, c, s, half);
  }
}

// out[r] = silu(gate_up[r, :dim]) * gate_up[r, dim:]
template <typename T>
void silu_and_mul(const T* gate_up, T* out, int64_t rows, int64_t dim, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * dim >= PARALLEL_ELEMENTS)
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * 2 * dim;
    const T* up = gate + dim;
    T* o = out + r * dim;
    int64_t i = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, uint16_t>) {  // 1.7x the rate of the loop below (libmvec's expf)
      for (; i + 16 <= dim; i += 16)
        store_bf16(o + i, _mm512_mul_ps(rounded_bf16(silu(load_bf16(gate + i))), load_bf16(up + i)));
    }
#endif
    for (; i < dim; ++i) {
      const float g = to_float(gate[i]);
      // e^-g capped below inf: under -ffast-math the division may be a reciprocal estimate (inf: NaN)
      store_scalar(o + i, rounded<T>(g / (1.0f + std::exp(std::min(-g, 87.0f)))) * to_float(up[i]));
    }
  }
}

}  // namespace

#define DEFINE_LAYER_OPS(SUFFIX, T)                                                                           \
  extern "C" int rms_norm_##SUFFIX(const T* x, int64_t x_stride, T* residual, T* out, const T* weight,       \
                                   int64_t rows, int64_t dim, float eps, int add, int num_threads) {         \
    rms_norm(x, x_stride, residual, out, weight, rows, dim, eps, add != 0, num_threads);                     \
    return 0;                                                                                                \
  }                                                                                                          \
  extern "C" int rotary_##SUFFIX(T* q, int64_t q_stride, int64_t num_q_heads, T* k, int64_t k_stride,        \
                                 int64_t num_k_heads, const T* cos, const T* sin, int64_t tokens,           \
                                 int64_t head_dim, int num_threads) {                                        \
    rotary(q, q_stride, num_q_heads, k, k_stride, num_k_heads, cos, sin, tokens, head_dim, num_threads);     \
    return 0;                                                                                                \
  }                                                                                                          \
  extern "C" int silu_and_mul_##SUFFIX(const T* gate_up, T* out, int64_t rows, int64_t dim, int num_threads) { \
    silu_and_mul(gate_up, out, rows, dim, num_threads);                                                      \
    return 0;                                                                                                \
  }

DEFINE_LAYER_OPS(bf16, uint16_t)
DEFINE_LAYER_OPS(f32, float)
