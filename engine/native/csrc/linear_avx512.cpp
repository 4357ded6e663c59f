// The bf16 linear on AVX512-BF16 (linear_tiled.h): vdpbf16ps takes one row of a packed tile (a pair of K for
// 16 output columns) against one input row's pair broadcast to every lane, so the AMX layout serves as is.
//
// Why: on a 2-core AMD EPYC with AVX512-BF16 and no AMX, oneDNN's packed bf16 kernel read `small`'s batch-1
// decode weights well below the cores' read bandwidth (docs/performance.md); this kernel streams each thread's
// contiguous share of the packed weight once per group of ROWS rows.
#include "linear_tiled.h"

#if defined(__AVX512BF16__)
#include <algorithm>
#include <vector>

namespace linear_tiled {
namespace {

using attention_tiles::broadcast_pair;
using attention_tiles::load_pairs;

constexpr int ROWS = 12;  // input rows per pass over a panel: 2 x 12 sums, 2 weight rows and a pair in registers
constexpr int64_t SLICE_STEPS = 8;  // depth steps per slice of a panel over several row groups (16 KB)

// sums[r * PANEL .. + 32] (+)= rows r < R of x . the panel's columns, over depth steps [k0, k1); `resume` adds to
// the sums there.
// Of each depth step it reads, the group fetches share `part` of `parts` of the lines `ahead` steps later.
template <int R>
__attribute__((always_inline)) inline void row_group(const uint16_t* x, int64_t K, const uint16_t* w, int64_t k0,
                                                     int64_t k1, int64_t ahead, int64_t part, int64_t parts,
                                                     bool resume, float* sums) {
  // Sums per output vector: one or two rows alone leave vdpbf16ps's latency exposed, so each keeps two.
  constexpr int U = R <= 2 ? 2 : 1;
  __m512 acc[R][2][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][0][u] = acc[r][1][u] = _mm512_setzero_ps();
  if (resume)
    for (int r = 0; r < R; ++r)
      acc[r][0][0] = _mm512_loadu_ps(sums + r * PANEL), acc[r][1][0] = _mm512_loadu_ps(sums + r * PANEL + 16);
  for (int64_t k = k0; k < k1; ++k) {
    const uint16_t* b = w + k * 2 * TILE;
    prefetch_share(b, ahead, part, parts);
#pragma GCC unroll 16
    for (int pair = 0; pair < 16; ++pair) {
      const __m512bh lo = load_pairs(b + pair * 32), hi = load_pairs(b + TILE + pair * 32);
      for (int r = 0; r < R; ++r) {
        const __m512bh a = broadcast_pair(x + r * K + k * DEPTH + pair * 2);
        acc[r][0][pair % U] = _mm512_dpbf16_ps(acc[r][0][pair % U], a, lo);
        acc[r][1][pair % U] = _mm512_dpbf16_ps(acc[r][1][pair % U], a, hi);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    __m512 lo = acc[r][0][0], hi = acc[r][1][0];
    if constexpr (U == 2) lo = _mm512_add_ps(lo, acc[r][0][1]), hi = _mm512_add_ps(hi, acc[r][1][1]);
    _mm512_storeu_ps(sums + r * PANEL, lo);
    _mm512_storeu_ps(sums + r * PANEL + 16, hi);
  }
}

}  // namespace

void panels_avx512(const uint16_t* x, int64_t M, int64_t K, const uint16_t* packed, const uint16_t* bias, int64_t N,
                   Epilogue epilogue, void* y, int64_t first, int64_t last) {
  const int64_t depth = K / DEPTH, groups = (M + ROWS - 1) / ROWS;
  // Over more rows than one group, a panel is read in slices that stay in L1 while every group reads them, the
  // sums waiting in `sums` between slices, and the groups share the fetching of the next slice: read whole, the
  // weight came from memory while the first group ran and from cache for the others, so its reads hid under a
  // third of the work.
  const int64_t slice = groups > 1 ? SLICE_STEPS : depth, ahead = groups > 1 ? SLICE_STEPS : PREFETCH_STEPS;
  std::vector<float> sums(M * PANEL);
  for (int64_t p = first; p < last; ++p) {
    const uint16_t* w = packed + p * depth * 2 * TILE;
    for (int64_t k0 = 0; k0 < depth; k0 += slice) {
      const int64_t k1 = std::min(depth, k0 + slice);
      for (int64_t g = 0, m0 = 0; g < groups; ++g) {
        const int64_t rows = (M - m0) / (groups - g);  // even groups: 32 rows as 11 + 11 + 10, not 12 + 12 + 8
        attention_tiles::with_rows<ROWS>(static_cast<int>(rows), [&](auto r) {
          row_group<decltype(r)::value>(x + m0 * K, K, w, k0, k1, ahead, g, groups, k0 > 0, sums.data() + m0 * PANEL);
        });
        if (k1 == depth) finish_rows(sums.data() + m0 * PANEL, rows, m0, p, bias, N, epilogue, y);
        m0 += rows;
      }
    }
  }
}

}  // namespace linear_tiled
#endif
