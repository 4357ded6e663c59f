// The building blocks of paged_attention.cpp: fp32 vectors (GCC vector extensions), bf16 conversion, a
// vectorized 2^x, and the two GEMM micro-tiles (Q.K^T over a transposed K block, P.V over V rows).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attention_tiles {

// Native vector width in floats (GCC vector extensions compile to the widest registers -march=native has).
#if defined(__AVX512F__)
constexpr int W = 16;
#elif defined(__AVX__)
constexpr int W = 8;
#else
constexpr int W = 4;
#endif
constexpr int MAX_ROWS = 12 * W / 16;  // rows per GEMM micro-tile: rows x 16 floats fill 12 registers
constexpr int COLS = 16;              // head_dim columns per P.V micro-tile

template <int N>
struct Vec {
  typedef float f __attribute__((vector_size(4 * N)));
  typedef int32_t i __attribute__((vector_size(4 * N)));
  typedef uint32_t u __attribute__((vector_size(4 * N)));
  typedef uint16_t h __attribute__((vector_size(2 * N)));
};
using vf = Vec<W>::f;
using vi = Vec<W>::i;

template <int N>
inline typename Vec<N>::f load(const float* p) {
  typename Vec<N>::f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int N>
inline typename Vec<N>::f load(const uint16_t* p) {  // bf16 -> fp32: the bf16 bits are the high half
  typename Vec<N>::h h;
  std::memcpy(&h, p, sizeof h);
  typename Vec<N>::u bits = __builtin_convertvector(h, typename Vec<N>::u) << 16;
  typename Vec<N>::f v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
inline void store(float* p, const vf& v) { std::memcpy(p, &v, sizeof v); }
inline vf splat(float x) { return vf{} + x; }

inline float to_float(float x) { return x; }
inline float to_float(uint16_t bf16) {
  uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline void store_scalar(float* dst, float x) { *dst = x; }
inline void store_scalar(uint16_t* dst, float x) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFF + ((bits >> 16) & 1);
  *dst = static_cast<uint16_t>(bits >> 16);
}

#if defined(__AVX512F__)
// 16 bf16 rounded from fp32 to nearest even, as store_scalar does: as fp32 (low half zero), or packed.
inline __m512i round_bf16_bits(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
}
inline __m512 rounded_bf16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(round_bf16_bits(x), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline __m512 load_bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store_bf16(uint16_t* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16_bits(x), 16)));
}
#endif

// 2^f for |f| <= 0.5 by its Taylor polynomial: relative error below 2e-7 at degree 6 (fp32), 6e-5 at
// degree 4 (enough where the result is rounded to bf16).
constexpr float EXP2_TAYLOR[] = {1.0f, 6.9314718055994531e-01f, 2.4022650695910071e-01f, 5.5504108664821580e-02f,
                                 9.6181291076284772e-03f, 1.3333558146428443e-03f, 1.5403530393381609e-04f};
template <int DEGREE>
inline vf exp2_fraction(vf f) {
  vf p = splat(EXP2_TAYLOR[DEGREE]);
#pragma GCC unroll 8
  for (int k = DEGREE - 1; k >= 0; --k) p = p * f + EXP2_TAYLOR[k];
  return p;
}

// 2^x for x <= 0, vectorized: x = n + f with n the nearest integer, 2^f by exp2_fraction, times 2^n.
#if defined(__AVX512F__)
template <int DEGREE = 6>
inline vf exp2_nonpositive(vf x) {  // vscalefps multiplies by 2^n and flushes to 0 far below 2^-126
  const vf n = (vf)_mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return (vf)_mm512_scalef_ps((__m512)exp2_fraction<DEGREE>(x - n), (__m512)n);
}
#else
template <int DEGREE = 6>
inline vf exp2_nonpositive(vf x) {  // 2^n added to the exponent bits; clamped at -125, where 2^x is ~0
  x = x > -125.0f ? x : -125.0f;
  const vi n = __builtin_convertvector(x - 0.5f, vi);  // truncation of a negative number: ceil(x - 0.5)
  vf p = exp2_fraction<DEGREE>(x - __builtin_convertvector(n, vf));
  vi bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += n << 23;
  std::memcpy(&p, &bits, sizeof p);
  return p;
}
#endif

inline float reduce_max(const vf& v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps((__m512)v);
#else
  float m = v[0];
  for (int i = 1; i < W; ++i) m = std::max(m, v[i]);
  return m;
#endif
}
inline float reduce_sum(const vf& v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#else
  float sum = 0.0f;
  for (int i = 0; i < W; ++i) sum += v[i];
  return sum;
#endif
}

// Calls fn(std::integral_constant<int, rows>) for a runtime 1 <= rows <= MAX_ROWS.
template <int R = MAX_ROWS, typename Fn>
inline void with_rows(int rows, Fn&& fn) {
  if constexpr (R > 1) {
    if (rows < R) return with_rows<R - 1>(rows, fn);
  }
  fn(std::integral_constant<int, R>{});
}

// s[R][N] = q[R][D] . kt[D][N]: N keys of one transposed K block (row stride block_size).
template <int R, int N, typename T>
inline void qk_tile(const float* q, int64_t head_dim, const T* kt, int64_t block_size, float* s, int64_t lds) {
  constexpr int L = N < W ? N : W, C = N / L;  // C vectors of L floats per row
  typename Vec<L>::f acc[R][C] = {};
  for (int64_t d = 0; d < head_dim; ++d) {
    typename Vec<L>::f k[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) k[c] = load<L>(kt + d * block_size + c * L);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float x = q[r * head_dim + d];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] += x * k[c];
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(s + r * lds, acc[r], sizeof acc[r]);
}

// The same for tiles of few rows (decode steps: 1 token x the GQA group), C blocks at once: R x C
// independent accumulators hide the FMA latency that R alone leaves exposed. Block c of `kt` gives keys
// [c * W, (c + 1) * W) of s; block_size == W.
template <int R, int C, typename T>
__attribute__((always_inline)) inline void qk_tile_blocks(const float* q, int64_t head_dim, const T* const* kt,
                                                          float* s, int64_t lds) {
  vf acc[R][C] = {};
  const T* blocks[C];
  for (int c = 0; c < C; ++c) blocks[c] = kt[c];
  for (int64_t d = 0; d < head_dim; ++d) {
    vf k[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) k[c] = load<W>(blocks[c] + d * W);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float x = q[r * head_dim + d];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] += x * k[c];
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(s + r * lds, acc[r], sizeof acc[r]);
}

// o[R][C * W] += p[R][keys] . V[keys][C * W] (C * W = COLS unless given): one column panel of the keys'
// V rows, the keys spread over the V blocks `v_blocks` (row stride head_dim).
template <int R, int C = COLS / W, typename T>
inline void pv_tile(const float* p, int64_t ldp, const T* const* v_blocks, int64_t block_size, int64_t num_keys,
                    int64_t head_dim, float* o) {
  vf acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = load<W>(o + r * head_dim + c * W);
  for (int64_t b = 0, key = 0; key < num_keys; ++b) {
    const T* v = v_blocks[b];
    for (const int64_t end = std::min(key + block_size, num_keys); key < end; ++key, v += head_dim) {
      vf row[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) row[c] = load<W>(v + c * W);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const float x = p[r * ldp + key];
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[r][c] += x * row[c];
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) store(o + r * head_dim + c * W, acc[r][c]);
}

#if defined(__AVX512BF16__)
// bf16 on CPUs with AVX512-BF16: vdpbf16ps multiplies pairs of bf16 and adds both products to one fp32
// lane, twice the FMAs of converting to fp32 first. The pairs run along each product's reduction, so the
// cache holds K blocks as [head_dim / 2][block_size][2] (pairs of dims per key) and V blocks as
// [block_size / 2][head_dim][2] (pairs of keys per dim); write_cache lays them out so.
constexpr bool PAIRED_BF16 = true;

inline __m512bh broadcast_pair(const uint16_t* p) {
  uint32_t pair;
  std::memcpy(&pair, p, sizeof pair);
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
}
inline __m512bh load_pairs(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// s[R][C * 16] = scale * q[R][D] . K: C vectors of 16 keys, vector c starting at kt[c] (pair rows of
// pair_stride elements); q in bf16, unscaled.
template <int R, int C>
__attribute__((always_inline)) inline void qk_tile_paired(const uint16_t* q, int64_t head_dim,
                                                          const uint16_t* const* kt, int64_t pair_stride,
                                                          float scale, float* s, int64_t lds) {
  __m512 acc[R][C];
  const uint16_t* keys[C];
  for (int c = 0; c < C; ++c) keys[c] = kt[c];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += 2) {
    __m512bh k[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) k[c] = load_pairs(keys[c] + d / 2 * pair_stride);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh x = broadcast_pair(q + r * head_dim + d);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, k[c]);
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(s + r * lds + c * 16, _mm512_mul_ps(acc[r][c], vscale));
}

// o[R][C * 16] += p[R][keys] . V[keys][col : col + C * 16], p in bf16 with a zero past an odd num_keys,
// the keys spread over the V blocks `v_blocks` (pair rows of 2 * head_dim elements).
template <int R, int C>
__attribute__((always_inline)) inline void pv_tile_paired(const uint16_t* p, int64_t ldp,
                                                          const uint16_t* const* v_blocks, int64_t col,
                                                          int64_t block_size, int64_t num_keys,
                                                          int64_t head_dim, float* o) {
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_loadu_ps(o + r * head_dim + c * 16);
  for (int64_t b = 0, key = 0; key < num_keys; ++b) {
    const uint16_t* v = v_blocks[b] + 2 * col;
    for (const int64_t end = std::min(key + block_size, num_keys); key < end; key += 2, v += 2 * head_dim) {
      // A lone last key's pair partner is a slot past the sequence (stale, maybe not finite): load zeros.
      const __mmask32 keep = key + 1 < end ? 0xFFFFFFFFu : 0x55555555u;
      __m512bh pairs[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) pairs[c] = (__m512bh)_mm512_maskz_loadu_epi16(keep, v + c * 32);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512bh x = broadcast_pair(p + r * ldp + key);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, pairs[c]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + r * head_dim + c * 16, acc[r][c]);
}
#else
constexpr bool PAIRED_BF16 = false;
#endif

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
// AMX (Intel Sapphire Rapids and later): tile registers of 16 rows x 64 bytes and one instruction for a
// 16 x 16 x 32 bf16 product into fp32, ~8x the paired dot products' rate. Prefill tasks (16 rows or more)
// run their Q.K^T and P.V on it; the paired cache layout is AMX's: a K block's pair rows are the B
// operand of Q.K^T, a V block's the B operand of P.V. Rows are padded to 16 (zero rows).
constexpr bool AMX_BF16 = true;
constexpr int AMX_ROWS = 16;
// Tiles: 0-3 accumulators (16 x 16 fp32); 4, 5: Q.K^T's A (16 rows x 32 dims) and B (16 dim pairs x 16
// keys); 6, 7: P.V's A (16 rows x 16 keys) and B (8 key pairs x 16 dims).
struct alignas(64) TileConfig {  // palette 1: bytes per row and rows of each tile
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16];
  uint8_t rows[16];
};
inline constexpr TileConfig ATTENTION_TILES{1, 0, {}, {64, 64, 64, 64, 64, 64, 32, 64}, {16, 16, 16, 16, 16, 16, 16, 8}};

// The kernel asks Linux for the tile state once per process (oneDNN may have already).
bool amx_permitted();

// s[rows][16 * num_groups] = q[rows][D] . K for 16-key groups (group i: the keys at k_groups[i], pair rows
// of pair_stride elements); rows a multiple of 16, D of 32. Unscaled.
inline void qk_chunk_amx(const uint16_t* q, int64_t rows, int64_t D, const uint16_t* const* k_groups,
                         int64_t num_groups, int64_t pair_stride, float* s, int64_t lds) {
  for (int64_t r0 = 0; r0 < rows; r0 += AMX_ROWS) {
    for (int64_t g0 = 0; g0 < num_groups; g0 += 4) {
      const int64_t n = std::min<int64_t>(4, num_groups - g0);
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t d = 0; d < D; d += 32) {
        _tile_loadd(4, q + r0 * D + d, D * 2);
        const int64_t pair_row = d / 2 * pair_stride;
        _tile_loadd(5, k_groups[g0] + pair_row, pair_stride * 2); _tile_dpbf16ps(0, 4, 5);
        if (n > 1) { _tile_loadd(5, k_groups[g0 + 1] + pair_row, pair_stride * 2); _tile_dpbf16ps(1, 4, 5); }
        if (n > 2) { _tile_loadd(5, k_groups[g0 + 2] + pair_row, pair_stride * 2); _tile_dpbf16ps(2, 4, 5); }
        if (n > 3) { _tile_loadd(5, k_groups[g0 + 3] + pair_row, pair_stride * 2); _tile_dpbf16ps(3, 4, 5); }
      }
      float* dst = s + r0 * lds + g0 * 16;
      _tile_stored(0, dst, lds * 4);
      if (n > 1) _tile_stored(1, dst + 16, lds * 4);
      if (n > 2) _tile_stored(2, dst + 32, lds * 4);
      if (n > 3) _tile_stored(3, dst + 48, lds * 4);
    }
  }
}

// o[rows][D] += p[rows][16 * num_groups] . V for 16-key groups (group i: 8 key pairs at v_groups[i], pair
// rows of 2 * D elements); rows a multiple of 16, D of 16.
inline void pv_chunk_amx(const uint16_t* p, int64_t rows, int64_t lds, const uint16_t* const* v_groups,
                         int64_t num_groups, int64_t D, float* o) {
  for (int64_t r0 = 0; r0 < rows; r0 += AMX_ROWS) {
    for (int64_t c0 = 0; c0 < D; c0 += 64) {
      const int64_t n = std::min<int64_t>(4, (D - c0) / 16);
      float* acc = o + r0 * D + c0;
      _tile_loadd(0, acc, D * 4);
      if (n > 1) _tile_loadd(1, acc + 16, D * 4);
      if (n > 2) _tile_loadd(2, acc + 32, D * 4);
      if (n > 3) _tile_loadd(3, acc + 48, D * 4);
      for (int64_t g = 0; g < num_groups; ++g) {
        _tile_loadd(6, p + r0 * lds + g * 16, lds * 2);
        const uint16_t* v = v_groups[g] + 2 * c0;
        _tile_loadd(7, v, D * 4); _tile_dpbf16ps(0, 6, 7);
        if (n > 1) { _tile_loadd(7, v + 32, D * 4); _tile_dpbf16ps(1, 6, 7); }
        if (n > 2) { _tile_loadd(7, v + 64, D * 4); _tile_dpbf16ps(2, 6, 7); }
        if (n > 3) { _tile_loadd(7, v + 96, D * 4); _tile_dpbf16ps(3, 6, 7); }
      }
      _tile_stored(0, acc, D * 4);
      if (n > 1) _tile_stored(1, acc + 16, D * 4);
      if (n > 2) _tile_stored(2, acc + 32, D * 4);
      if (n > 3) _tile_stored(3, acc + 48, D * 4);
    }
  }
}
#else
constexpr bool AMX_BF16 = false;
#endif

#if defined(__AVX512F__)
// silu(g) = g / (1 + e^-g) for 16 lanes, e^-g as 2^(-g log2 e) by exp2_fraction. e^-g is capped at 2^126:
// -ffast-math lets the compiler turn the division into a reciprocal estimate, which an inf makes NaN.
inline __m512 silu(__m512 g) {
  const __m512 x = _mm512_min_ps(_mm512_mul_ps(g, _mm512_set1_ps(-1.4426950408889634f)), _mm512_set1_ps(126.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 e = _mm512_scalef_ps((__m512)exp2_fraction<6>((vf)_mm512_sub_ps(x, n)), n);
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#endif

}  // namespace attention_tiles
