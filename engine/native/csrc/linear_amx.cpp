// The bf16 linear on AMX tiles (linear_tiled.h): each B tile load is a whole 1 KB of the packed weight, and
// each thread streams one contiguous run of it (its share of the output columns).
//
// Why: at 32 rows, `small`'s decode linears read 151 MB per step, and oneDNN's packed kernel streamed them at
// 17 GB/s on a 2-core Xeon whose cores read 31 GB/s; this kernel read them at 31 GB/s. Prefill chunks run
// through the same loop, 32 rows at a time over each panel, which stays in cache.
#include "linear_tiled.h"

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
#include <algorithm>
#include <vector>

namespace linear_tiled {
namespace {

constexpr int64_t MAX_ROWS = 32;  // rows per pass over a panel: two 16-row A tiles
// Depth steps per slice of a panel (16 KB of weight) over 32 rows: a 512-token chunk's gate_up projection
// ran 1.14x faster than unsliced (4 steps: slower, 16: no faster), its down projection (K = 2048) 1.27x
// slower, hence slices only up to SLICE_MAX_K inputs.
constexpr int64_t SLICE_STEPS = 8;
constexpr int64_t SLICE_MAX_K = 1024;

// Every tile 16 rows x 64 bytes: 0-3 accumulators, 4-5 x, 6-7 W.
inline constexpr attention_tiles::TileConfig LINEAR_TILES{
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

}  // namespace

// With SILU_AND_MUL, each panel holds 16 gate columns then their 16 up columns, and y gets silu(gate) * up:
// N / 2 columns, 16 per panel.
void panels_amx(const uint16_t* x, int64_t M, int64_t rows_padded, int64_t K, const uint16_t* packed,
                const uint16_t* bias, int64_t N, Epilogue epilogue, void* y, int64_t first, int64_t last) {
  _tile_loadconfig(&LINEAR_TILES);
  const int64_t depth = K / DEPTH;
  // Over 32 rows, a panel's weight is read once per 32 rows: in slices of SLICE_STEPS depth steps, each
  // slice stays in L1 while every row group reads it, and the sums wait in acc between slices. Deep
  // inputs (`small`'s down projection, K = 2048) ran slower so: their rows no longer fit in L2 either.
  const int64_t slice = rows_padded > MAX_ROWS && K <= SLICE_MAX_K ? SLICE_STEPS : depth;
  std::vector<float> acc(slice < depth ? rows_padded * PANEL : 0);
  alignas(64) float done[MAX_ROWS * PANEL];  // a row group's finished sums, for the epilogue
  for (int64_t p = first; p < last; ++p) {
    const uint16_t* w = packed + p * depth * 2 * TILE;
    for (int64_t k0 = 0; k0 < depth; k0 += slice) {
      const int64_t k1 = std::min(depth, k0 + slice);
      for (int64_t m0 = 0; m0 < rows_padded; m0 += MAX_ROWS) {
        const bool two = m0 + 16 < rows_padded;
        float* sums = k1 == depth ? done : acc.data() + m0 * PANEL;
        if (k0 == 0) {
          _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        } else {
          const float* partial = acc.data() + m0 * PANEL;
          _tile_loadd(0, partial, PANEL * 4);
          _tile_loadd(1, partial + 16, PANEL * 4);
          if (two) {
            _tile_loadd(2, partial + 16 * PANEL, PANEL * 4);
            _tile_loadd(3, partial + 16 * PANEL + 16, PANEL * 4);
          }
        }
        for (int64_t k = k0; k < k1; ++k) {
          const uint16_t* b = w + k * 2 * TILE;
          if (m0 == 0) prefetch_ahead(b);  // the weight's first pass (reads past this thread's share are harmless)
          _tile_loadd(6, b, 64);
          _tile_loadd(7, b + TILE, 64);
          _tile_loadd(4, x + m0 * K + k * DEPTH, K * 2);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          if (two) {
            _tile_loadd(5, x + (m0 + 16) * K + k * DEPTH, K * 2);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, sums, PANEL * 4);
        _tile_stored(1, sums + 16, PANEL * 4);
        if (two) {
          _tile_stored(2, sums + 16 * PANEL, PANEL * 4);
          _tile_stored(3, sums + 16 * PANEL + 16, PANEL * 4);
        }
        // The row group is done: its output now, while its sums are in L1 and the stores can drain under the
        // next group's tile products (a pass over the whole panel afterwards was 10-20% of a prefill linear).
        if (k1 == depth) finish_rows(done, std::min(MAX_ROWS, M - m0), m0, p, bias, N, epilogue, y);
      }
    }
  }
  _tile_release();
}

}  // namespace linear_tiled
#endif
