// The bf16 linear's packed weight layout, its epilogues and its paths by ISA (linear_tiled.cpp picks one):
// AMX tiles (linear_amx.cpp), AVX512-BF16 dot products (linear_avx512.cpp), or the reference loop.
//
// Packed layout: for each 32-column panel p, for each 32-deep slice k of K, two tiles (columns p*32 .. +16 and
// p*32+16 .. +16), each 16 rows (pairs of K) x 16 columns x 2 (the pair). An AMX B tile is one such tile; a
// row of it (one pair of K for 16 columns, 64 bytes) is one vdpbf16ps operand.
#pragma once

#include <cstdint>

#include "attention_tiles.h"

namespace linear_tiled {

constexpr int64_t PANEL = 32;      // output columns per panel: two 16-column tiles
constexpr int64_t DEPTH = 32;      // K per tile (16 pairs)
constexpr int64_t TILE = 16 * 32;  // bf16 elements per tile (1 KB)
// Depth steps (2 KB of weight each) fetched ahead: 4 read a decode step's weights 6% faster than the
// hardware prefetcher alone, 8 and 16 no faster (2-core Xeon).
constexpr int64_t PREFETCH_STEPS = 4;

// What the kernel writes (TiledLinear's epilogue): the product in bf16; silu(gate) * up of a [gate | up]
// projection; or the bf16 product's values as fp32, for the logits, which sampling reads in fp32 (a
// pass of .float() over 32 x 32,000 logits took 0.3 ms of a decode step).
enum Epilogue : int { BF16 = 0, SILU_AND_MUL = 1, FLOAT = 2 };

// The paths by ISA, in the order of preference (linear_tiled_path() in linear_tiled.cpp).
enum Path : int { REFERENCE = 0, AVX512_BF16 = 1, AMX = 2 };

// Share `part` of `parts` of the lines of the depth step `ahead` steps after `step`: row groups that read a slice
// from cache fetch the next one between them.
inline void prefetch_share(const uint16_t* step, int64_t ahead, int64_t part, int64_t parts) {
  const char* later = reinterpret_cast<const char*>(step + ahead * 2 * TILE);
  for (int64_t line = part * 64; line < 2 * TILE * 2; line += parts * 64) __builtin_prefetch(later + line);
}

inline void prefetch_ahead(const uint16_t* step) { prefetch_share(step, PREFETCH_STEPS, 0, 1); }

#if defined(__AVX512F__)
// Rows [m0, m0 + rows) of panel p, whose sums (bias not yet added) are done[r * PANEL .. + 32], through the
// epilogue into y: rounded where the unfused ops round (the projection, silu, the product).
inline void finish_rows(const float* done, int64_t rows, int64_t m0, int64_t p, const uint16_t* bias, int64_t N,
                        Epilogue epilogue, void* y) {
  using namespace attention_tiles;
  const __m512 bias_lo = bias ? load_bf16(bias + p * PANEL) : _mm512_setzero_ps();
  const __m512 bias_hi = bias ? load_bf16(bias + p * PANEL + 16) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 lo = _mm512_add_ps(_mm512_loadu_ps(done + r * PANEL), bias_lo);
    const __m512 hi = _mm512_add_ps(_mm512_loadu_ps(done + r * PANEL + 16), bias_hi);
    if (epilogue == SILU_AND_MUL) {
      const __m512 gate = rounded_bf16(lo), up = rounded_bf16(hi);
      store_bf16(static_cast<uint16_t*>(y) + (m0 + r) * (N / 2) + p * 16, _mm512_mul_ps(rounded_bf16(silu(gate)), up));
    } else if (epilogue == FLOAT) {
      float* out = static_cast<float*>(y) + (m0 + r) * N + p * PANEL;
      _mm512_storeu_ps(out, rounded_bf16(lo));
      _mm512_storeu_ps(out + 16, rounded_bf16(hi));
    } else {
      uint16_t* out = static_cast<uint16_t*>(y) + (m0 + r) * N + p * PANEL;
      store_bf16(out, lo);
      store_bf16(out + 16, hi);
    }
  }
}
#endif

// Panels [first, last) of y = x[M, K] . W^T for one thread, on one path. AMX: x has rows_padded rows (a multiple
// of 16, zero past M).
void panels_amx(const uint16_t* x, int64_t M, int64_t rows_padded, int64_t K, const uint16_t* packed,
                const uint16_t* bias, int64_t N, Epilogue epilogue, void* y, int64_t first, int64_t last);
void panels_avx512(const uint16_t* x, int64_t M, int64_t K, const uint16_t* packed, const uint16_t* bias, int64_t N,
                   Epilogue epilogue, void* y, int64_t first, int64_t last);

}  // namespace linear_tiled
