// The bf16 linear y[M, N] = x[M, K] . W[N, K]^T (+ bias) with W packed once at load (linear_tiled.h), on the
// best path this CPU has: AMX tiles, else AVX512-BF16 dot products, else `reference`. One entry point and one
// layout for all three, so TiledLinear, the native decoder layer and its tensor-parallel split run on any CPU;
// tests force each path that can run (linear_tiled_select) and compare it with the reference loop.
//
// `reference`: the same layout, epilogues and roundings, the sums in a plain fp32 loop. The engine never picks
// it (on such CPUs oneDNN is faster).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "layer_kernels.h"
#include "linear_tiled.h"

namespace {

using namespace linear_tiled;

// Rows per pass over the weight: every panel reads all of the pass's input, which should stay in L2 (512 x
// 768 bf16: 768 KB). A 4,096-token prefill in one pass read its 6 MB input from memory once per panel.
constexpr int64_t ROW_BLOCK = 512;

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

Path best_path() {
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
  if (attention_tiles::amx_permitted()) return AMX;
#endif
#if defined(__AVX512BF16__)
  return AVX512_BF16;
#else
  return REFERENCE;
#endif
}

bool runs_here(int path) {
  return path == REFERENCE || (path == AVX512_BF16 && best_path() >= AVX512_BF16) || (path == AMX && best_path() == AMX);
}

std::atomic<int> selected{-1};  // a path forced by linear_tiled_select; -1: the best

}  // namespace

// The path linear_tiled_bf16 runs (a Path): the one selected, else the best this CPU and build have.
extern "C" int linear_tiled_path() {
  const int path = selected.load();
  return path >= 0 ? path : best_path();
}

// Run `path` from now on (-1: the best again). 0 on success; 1 where the path cannot run here.
extern "C" int linear_tiled_select(int path) {
  if (path >= 0 && !runs_here(path)) return 1;
  selected.store(path);
  return 0;
}

extern "C" int linear_tiled_pack(const uint16_t* w, int64_t N, int64_t K, uint16_t* out) {
  pack(w, N, K, out);
  return 0;
}

// 0 on success. epilogue: an Epilogue; y: bf16, or fp32 for FLOAT.
extern "C" int linear_tiled_bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                                 const uint16_t* bias, int epilogue, void* y, int num_threads) {
  const Epilogue kind = static_cast<Epilogue>(epilogue);
  const int path = linear_tiled_path();
  if (path == REFERENCE) {
    reference(x, M, K, packed, N, bias, kind, y, num_threads);
    return 0;
  }
  const int64_t num_panels = N / PANEL, out_features = kind == SILU_AND_MUL ? N / 2 : N;
  const int64_t out_bytes = kind == FLOAT ? sizeof(float) : sizeof(uint16_t);
  std::vector<uint16_t> padded;
  for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
    const int64_t rows = std::min(ROW_BLOCK, M - m0);
    const int64_t rows_padded = path == AMX ? (rows + 15) / 16 * 16 : rows;
    const uint16_t* block = x + m0 * K;
    if (rows_padded != rows) {  // A tiles take 16 rows: zero rows past the input's
      padded.assign(rows_padded * K, 0);
      std::memcpy(padded.data(), block, rows * K * sizeof(uint16_t));
      block = padded.data();
    }
    void* out = static_cast<char*>(y) + m0 * out_features * out_bytes;
#pragma omp parallel num_threads(num_threads)
    {
      // Contiguous shares of the panels: each thread reads one run of the packed weight.
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t first = num_panels * t / threads, last = num_panels * (t + 1) / threads;
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
      if (path == AMX) panels_amx(block, rows, rows_padded, K, packed, bias, N, kind, out, first, last);
#endif
#if defined(__AVX512BF16__)
      if (path == AVX512_BF16) panels_avx512(block, rows, K, packed, bias, N, kind, out, first, last);
#endif
    }
  }
  return 0;
}
