// The linear with fp32 inputs and outputs and bf16 weights in the tiled layout (linear_tiled.h): each weight pair
// widened to fp32 in registers (a shift and a mask of its 32 bits), the products fp32 FMAs.
//
// Why: on a CPU without native bf16 (AVX2, or AVX-512 without BF16) bf16 matmuls are emulated, ~100x slower
// than fp32, so such CPUs run models in fp32, and a decode step, bound by memory, reads 4 bytes a weight.
// Stored in 16 bits, it reads 2: the widening costs two vector operations per 16 or 8 weights loaded, which a
// step bound by memory does not notice. GCC vector extensions: one loop for every vector width.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "layer_kernels.h"
#include "linear_tiled.h"

namespace {

using namespace linear_tiled;
using attention_tiles::vf;
using vu = attention_tiles::Vec<attention_tiles::W>::u;

constexpr int COLV = PANEL / attention_tiles::W;  // vectors across a panel's 32 columns
constexpr int ROWS = std::max(1, (attention_tiles::W == 16 ? 16 : 12) / COLV);  // rows per pass over a panel: sums in 16 of 32 registers (12 of 16)
constexpr int64_t SLICE_STEPS = 8;               // depth steps per slice of a panel over several row groups (32 KB in fp32)
constexpr int WIDEN_GROUPS = 4;                 // above this many row groups, each slice is widened once for all
constexpr int64_t ROW_BLOCK = 256;              // rows per pass over the weight (fp32 input: 256 x 768 = 768 KB)

// sums[r * PANEL .. + 32] (+)= rows r < R of x . the panel's columns over depth steps [k0, k1), widening each
// weight pair as it comes (a decode step's few rows, bound by the weight's reads); as in linear_avx512.cpp, of each
// step the group fetches share `part` of `parts` of the lines `ahead` steps later.
template <int R>
__attribute__((always_inline)) inline void row_group(const float* x, int64_t K, const uint16_t* w, int64_t k0,
                                                     int64_t k1, int64_t ahead, int64_t part, int64_t parts,
                                                     bool resume, float* sums) {
  // Sums per vector: a row or two alone chain their FMAs through one register, so each keeps the even and the
  // odd inputs' products apart.
  constexpr int U = R <= 2 ? 2 : 1;
  vf acc[R][COLV][U] = {};
  if (resume)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < COLV; ++v) std::memcpy(&acc[r][v][0], sums + r * PANEL + v * attention_tiles::W, sizeof(vf));
  for (int64_t k = k0; k < k1; ++k) {
    const uint16_t* b = w + k * 2 * TILE;
    prefetch_share(b, ahead, part, parts);
#pragma GCC unroll 4
    for (int pair = 0; pair < 16; ++pair) {
      float a[R][2];
      for (int r = 0; r < R; ++r) a[r][0] = x[r * K + k * DEPTH + pair * 2], a[r][1] = x[r * K + k * DEPTH + pair * 2 + 1];
      for (int v = 0; v < COLV; ++v) {
        // columns v * W ..: a run of one tile's pair row, each 32-bit lane a column's two weights (low: the even k)
        const int64_t column = v * attention_tiles::W;
        vu pairs;
        std::memcpy(&pairs, b + column / 16 * TILE + pair * 32 + column % 16 * 2, sizeof pairs);
        const vf even = (vf)(pairs << 16), odd = (vf)(pairs & 0xFFFF0000u);
        for (int r = 0; r < R; ++r) {
          acc[r][v][0] += a[r][0] * even;
          acc[r][v][U - 1] += a[r][1] * odd;
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < COLV; ++v) {
      if constexpr (U == 2) acc[r][v][0] += acc[r][v][1];
      std::memcpy(sums + r * PANEL + v * attention_tiles::W, &acc[r][v][0], sizeof(vf));
    }
}

// A slice of depth steps [k0, k1) of a panel widened to fp32, one row of 32 columns per input: out[k * PANEL + c].
void widen_slice(const uint16_t* w, int64_t k0, int64_t k1, float* out) {
  for (int64_t k = k0; k < k1; ++k) {
    const uint16_t* b = w + k * 2 * TILE;
    prefetch_ahead(b);
    for (int pair = 0; pair < 16; ++pair)
      for (int v = 0; v < COLV; ++v) {
        const int64_t column = v * attention_tiles::W;
        vu pairs;
        std::memcpy(&pairs, b + column / 16 * TILE + pair * 32 + column % 16 * 2, sizeof pairs);
        const vf even = (vf)(pairs << 16), odd = (vf)(pairs & 0xFFFF0000u);
        float* row = out + ((k - k0) * DEPTH + pair * 2) * PANEL + column;
        std::memcpy(row, &even, sizeof even);
        std::memcpy(row + PANEL, &odd, sizeof odd);
      }
  }
}

// sums[r * PANEL .. + 32] (+)= rows r < R of x (from the slice's first input on) . `depth` rows of a widened slice.
template <int R>
__attribute__((always_inline)) inline void widened_group(const float* x, int64_t K, const float* slice, int64_t depth,
                                                         bool resume, float* sums) {
  vf acc[R][COLV] = {};
  if (resume)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < COLV; ++v) std::memcpy(&acc[r][v], sums + r * PANEL + v * attention_tiles::W, sizeof(vf));
#pragma GCC unroll 4
  for (int64_t k = 0; k < depth; ++k) {
    vf w[COLV];
    for (int v = 0; v < COLV; ++v) std::memcpy(&w[v], slice + k * PANEL + v * attention_tiles::W, sizeof(vf));
    for (int r = 0; r < R; ++r) {
      const float a = x[r * K + k];
      for (int v = 0; v < COLV; ++v) acc[r][v] += a * w[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < COLV; ++v) std::memcpy(sums + r * PANEL + v * attention_tiles::W, &acc[r][v], sizeof(vf));
}

// Over more rows than one group, a panel is read in slices, the groups' sums waiting in `sums` between them. Over
// more than WIDEN_GROUPS groups each slice is first widened into an fp32 buffer that every group then runs plain
// FMAs on: widening pair by pair in every group (two operations per vector of weights) held a 512-row input at
// 0.82 of oneDNN's fp32 rate, once per slice at 0.93-0.94; at 32 rows widening pair by pair was the faster.
void panels(const float* x, int64_t M, int64_t K, const uint16_t* packed, const float* bias, int64_t N, float* y,
            int64_t first, int64_t last) {
  const int64_t depth = K / DEPTH, groups = (M + ROWS - 1) / ROWS, slice = groups > 1 ? SLICE_STEPS : depth;
  const int64_t ahead = groups > 1 ? SLICE_STEPS : PREFETCH_STEPS;
  const bool widen_once = groups > WIDEN_GROUPS;
  std::vector<float> sums(M * PANEL), wide(widen_once ? SLICE_STEPS * DEPTH * PANEL : 0);
  for (int64_t p = first; p < last; ++p) {
    const uint16_t* w = packed + p * depth * 2 * TILE;
    for (int64_t k0 = 0; k0 < depth; k0 += slice) {
      const int64_t k1 = std::min(depth, k0 + slice);
      if (widen_once) widen_slice(w, k0, k1, wide.data());
      for (int64_t g = 0, m0 = 0; g < groups; ++g) {
        const int64_t rows = (M - m0) / (groups - g);
        attention_tiles::with_rows<ROWS>(static_cast<int>(rows), [&](auto r) {
          if (widen_once)
            widened_group<decltype(r)::value>(x + m0 * K + k0 * DEPTH, K, wide.data(), (k1 - k0) * DEPTH, k0 > 0,
                                              sums.data() + m0 * PANEL);
          else
            row_group<decltype(r)::value>(x + m0 * K, K, w, k0, k1, ahead, g, groups, k0 > 0, sums.data() + m0 * PANEL);
        });
        if (k1 == depth)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < PANEL; ++c)
              y[(m0 + r) * N + p * PANEL + c] = sums[(m0 + r) * PANEL + c] + (bias ? bias[p * PANEL + c] : 0.0f);
        m0 += rows;
      }
    }
  }
}

}  // namespace

// y[M, N] = x[M, K] . W^T (+ bias), fp32 but for W: bf16, packed by linear_tiled_pack. 0 on success.
extern "C" int linear_widened_f32(const float* x, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                                  const float* bias, float* y, int num_threads) {
  const int64_t num_panels = N / PANEL;
  for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
    const int64_t rows = std::min(ROW_BLOCK, M - m0);
#pragma omp parallel num_threads(num_threads)
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      panels(x + m0 * K, rows, K, packed, bias, N, y + m0 * N, num_panels * t / threads,
             num_panels * (t + 1) / threads);
    }
  }
  return 0;
}
