// bf16 linears on AMX: y[M, N] = x[M, K] . W[N, K]^T (+ bias).
//
// A decode step's linears are a pass over the weights: at 32 rows, `small`'s decode linears read 151 MB per step,
// and oneDNN's packed kernel streamed them at 17 GB/s on a 2-core Xeon whose cores read 31 GB/s. Here
// the weight is packed once into AMX B tiles in the order the kernel reads them, so each thread streams
// one contiguous run of memory (its share of the output columns), and each tile load is a whole 1 KB.
// Prefill chunks run through the same loop, 32 rows at a time over each panel, which stays in cache.
//
// Packed layout: for each 32-column panel p, for each 32-deep slice k of K, two tiles (columns
// p*32 .. +16 and p*32+16 .. +16), each 16 rows (pairs of K) x 16 columns x 2 (the pair).
//
// Without AMX the same entry point runs `reference`: the same layout, epilogues and roundings, the sums in a
// plain fp32 loop. The engine never picks it there (linear_amx_available() is 0, and oneDNN is faster); tests
// force it so that what is built on the AMX linears (the native decoder layer and its tensor-parallel split)
// runs on any CPU.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_tiles.h"
#include "layer_kernels.h"

namespace {

constexpr int64_t PANEL = 32;       // output columns per panel: two 16-column tiles
constexpr int64_t DEPTH = 32;       // K per tile (16 pairs)
constexpr int64_t TILE = 16 * 32;   // bf16 elements per tile (1 KB)
constexpr int64_t MAX_ROWS = 32;    // rows per pass over a panel: two 16-row A tiles
// Depth steps (2 KB of weight each) fetched ahead: 4 read a decode step's weights 6% faster than the
// hardware prefetcher alone, 8 and 16 no faster (2-core Xeon).
constexpr int64_t PREFETCH_STEPS = 4;
// Depth steps per slice of a panel (16 KB of weight) over 32 rows: a 512-token chunk's gate_up projection
// ran 1.14x faster than unsliced (4 steps: slower, 16: no faster), its down projection (K = 2048) 1.27x
// slower, hence slices only up to SLICE_MAX_K inputs.
constexpr int64_t SLICE_STEPS = 8;
constexpr int64_t SLICE_MAX_K = 1024;
// Rows per pass over the weight: every panel reads all of the pass's input, which should stay in L2 (512 x
// 768 bf16: 768 KB). A 4,096-token prefill in one pass read its 6 MB input from memory once per panel.
constexpr int64_t ROW_BLOCK = 512;

// What the kernel writes (AmxLinear's epilogue): the product in bf16; silu(gate) * up of a [gate | up]
// projection; or the bf16 product's values as fp32, for the logits, which sampling reads in fp32 (a
// pass of .float() over 32 x 32,000 logits took 0.3 ms of a decode step).
enum Epilogue : int { BF16 = 0, SILU_AND_MUL = 1, FLOAT = 2 };

void pack(const uint16_t* w, int64_t N, int64_t K, uint16_t* out) {
  for (int64_t p = 0; p < N / PANEL; ++p)
    for (int64_t k = 0; k < K / DEPTH; ++k)
      for (int64_t half = 0; half < 2; ++half) {
        uint16_t* tile = out + ((p * (K / DEPTH) + k) * 2 + half) * TILE;
        for (int64_t pair = 0; pair < 16; ++pair)
          for (int64_t col = 0; col < 16; ++col)
            for (int64_t j = 0; j < 2; ++j)
              tile[(pair * 16 + col) * 2 + j] = w[(p * PANEL + half * 16 + col) * K + k * DEPTH + pair * 2 + j];
      }
}

// y = x . W^T read from the packed tiles, the sums in fp32, each row's output through the kernel's epilogue.
void reference(const uint16_t* x, int64_t M, int64_t K, const uint16_t* packed, int64_t N, const uint16_t* bias,
               Epilogue epilogue, void* y, int num_threads) {
  using attention_tiles::store_scalar;
  using attention_tiles::to_float;
  const auto rounded = [](float v) { uint16_t b; store_scalar(&b, v); return to_float(b); };
  const int64_t depth = K / DEPTH;
#pragma omp parallel for num_threads(num_threads)
  for (int64_t m = 0; m < M; ++m) {
    std::vector<float> row(N);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t p = n / PANEL, half = n % PANEL / 16, col = n % 16;
      float sum = 0.0f;
      for (int64_t k = 0; k < depth; ++k) {
        const uint16_t* tile = packed + ((p * depth + k) * 2 + half) * TILE;
        for (int64_t pair = 0; pair < 16; ++pair)
          for (int64_t j = 0; j < 2; ++j)
            sum += to_float(x[m * K + k * DEPTH + pair * 2 + j]) * to_float(tile[(pair * 16 + col) * 2 + j]);
      }
      row[n] = sum + (bias ? to_float(bias[n]) : 0.0f);
    }
    for (int64_t p = 0; p < N / PANEL; ++p)
      for (int64_t col = 0; col < 16; ++col) {
        const int64_t lo = p * PANEL + col, hi = lo + 16;
        if (epilogue == SILU_AND_MUL) {  // as the AMX epilogue rounds: the projection, silu, the product
          const float gate = rounded(row[lo]), up = rounded(row[hi]);
          const float silu = rounded(gate / (1.0f + std::exp(std::min(-gate, 87.0f))));
          store_scalar(static_cast<uint16_t*>(y) + m * (N / 2) + p * 16 + col, silu * up);
        } else if (epilogue == FLOAT) {
          static_cast<float*>(y)[m * N + lo] = rounded(row[lo]);
          static_cast<float*>(y)[m * N + hi] = rounded(row[hi]);
        } else {
          store_scalar(static_cast<uint16_t*>(y) + m * N + lo, row[lo]);
          store_scalar(static_cast<uint16_t*>(y) + m * N + hi, row[hi]);
        }
      }
  }
}

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
// Every tile 16 rows x 64 bytes: 0-3 accumulators, 4-5 x, 6-7 W.
inline constexpr attention_tiles::TileConfig LINEAR_TILES{
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

// x: rows_padded x K (a multiple of 16 rows, zero past M); the panels [first, last) of y. With
// SILU_AND_MUL, each panel holds 16 gate columns then their 16 up columns, and y gets silu(gate) * up:
// N / 2 columns, 16 per panel.
void panels(const uint16_t* x, int64_t M, int64_t rows_padded, int64_t K, const uint16_t* packed,
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
    const __m512 bias_lo = bias ? attention_tiles::load_bf16(bias + p * PANEL) : _mm512_setzero_ps();
    const __m512 bias_hi = bias ? attention_tiles::load_bf16(bias + p * PANEL + 16) : _mm512_setzero_ps();
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
          if (m0 == 0) {  // the weight's first pass: fetch ahead (reads past this thread's share are harmless)
            const char* ahead = reinterpret_cast<const char*>(b + PREFETCH_STEPS * 2 * TILE);
            for (int64_t line = 0; line < 2 * TILE * 2; line += 64) __builtin_prefetch(ahead + line);
          }
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
        if (k1 < depth) continue;
        // The row group is done: its output now, while its sums are in L1 and the stores can drain under the
        // next group's tile products (a pass over the whole panel afterwards was 10-20% of a prefill linear).
        for (int64_t r = 0; r < std::min(MAX_ROWS, M - m0); ++r) {
          const __m512 lo = _mm512_add_ps(_mm512_loadu_ps(done + r * PANEL), bias_lo);
          const __m512 hi = _mm512_add_ps(_mm512_loadu_ps(done + r * PANEL + 16), bias_hi);
          if (epilogue == SILU_AND_MUL) {  // rounded where the unfused ops round: the projection, silu, the product
            const __m512 gate = attention_tiles::rounded_bf16(lo), up = attention_tiles::rounded_bf16(hi);
            attention_tiles::store_bf16(static_cast<uint16_t*>(y) + (m0 + r) * (N / 2) + p * 16,
                                        _mm512_mul_ps(attention_tiles::rounded_bf16(attention_tiles::silu(gate)), up));
          } else if (epilogue == FLOAT) {
            float* out = static_cast<float*>(y) + (m0 + r) * N + p * PANEL;
            _mm512_storeu_ps(out, attention_tiles::rounded_bf16(lo));
            _mm512_storeu_ps(out + 16, attention_tiles::rounded_bf16(hi));
          } else {
            uint16_t* out = static_cast<uint16_t*>(y) + (m0 + r) * N + p * PANEL;
            attention_tiles::store_bf16(out, lo);
            attention_tiles::store_bf16(out + 16, hi);
          }
        }
      }
    }
  }
  _tile_release();
}
#endif

}  // namespace

// 1 where linear_amx_bf16 runs: the CPU and build have AMX and Linux grants the tile state.
extern "C" int linear_amx_available() {
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
  return attention_tiles::amx_permitted() ? 1 : 0;
#else
  return 0;
#endif
}

extern "C" int linear_amx_pack(const uint16_t* w, int64_t N, int64_t K, uint16_t* out) {
  pack(w, N, K, out);
  return 0;
}

// 0 on success. epilogue: an Epilogue; y: bf16, or fp32 for FLOAT. Where linear_amx_available() is 0: `reference`.
extern "C" int linear_amx_bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                               const uint16_t* bias, int epilogue, void* y, int num_threads) {
  const Epilogue kind = static_cast<Epilogue>(epilogue);
  if (linear_amx_available() == 0) {
    reference(x, M, K, packed, N, bias, kind, y, num_threads);
    return 0;
  }
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
  const int64_t num_panels = N / PANEL, out_features = kind == SILU_AND_MUL ? N / 2 : N;
  const int64_t out_bytes = kind == FLOAT ? sizeof(float) : sizeof(uint16_t);
  std::vector<uint16_t> padded;
  for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
    const int64_t rows = std::min(ROW_BLOCK, M - m0), rows_padded = (rows + 15) / 16 * 16;
    const uint16_t* block = x + m0 * K;
    if (rows_padded != rows) {  // A tiles take 16 rows: zero rows past the input's
      padded.assign(rows_padded * K, 0);
      std::memcpy(padded.data(), block, rows * K * sizeof(uint16_t));
      block = padded.data();
    }
#pragma omp parallel num_threads(num_threads)
    {
      // Contiguous shares of the panels: each thread reads one run of the packed weight.
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t first = num_panels * t / threads, last = num_panels * (t + 1) / threads;
      panels(block, rows, rows_padded, K, packed, bias, N, kind, static_cast<char*>(y) + m0 * out_features * out_bytes,
             first, last);
    }
  }
#endif
  return 0;
}
