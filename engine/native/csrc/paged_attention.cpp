// Paged attention on CPU for a whole flat batch (decodes and prefill chunks, with or without cached
// context) in one call, reading K/V in place from the paged cache through the block tables.
//
// Cache layout per layer (CPUPagedAttention): K and V are [num_kv_heads, num_blocks, block_size * head_dim].
// A K block is stored transposed, [head_dim, block_size], so Q.K^T is a small GEMM whose vector loads run
// along the keys (no horizontal sums); a V block is [block_size, head_dim], so P.V's loads run along
// head_dim. vLLM's CPU attention keeps the same two layouts.
//
// One task per (sequence, kv head, tile of query tokens): the tile's rows are its tokens x the query heads
// of the GQA group, so each K/V element loaded serves all of them. A task walks its keys in chunks with an
// fp32 online softmax (FlashAttention-2); the causal mask is aligned bottom-right: query i of a sequence
// with `context` cached tokens sees keys 0 .. context + i. Built by engine/native/cpu_kernels.py with
// -fopenmp; the OpenMP runtime is the one torch already loaded (same soname), so threads are shared.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "attention_tiles.h"
#include "layer_kernels.h"

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
// Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
// STALLFREE_NO_AMX=1 keeps the AVX512-BF16 path (A/B measurements).
bool attention_tiles::amx_permitted() {
  static const bool permitted = [] {
    const char* off = std::getenv("STALLFREE_NO_AMX");
    return !(off && *off && *off != '0') && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return permitted;
}
#endif

namespace {

using namespace attention_tiles;

constexpr int TILE_ROWS = 96;  // query rows (tokens x group heads) per task: amortizes each K/V load
constexpr int KEY_CHUNK = 128;  // keys per online-softmax step (rounded to whole blocks)
constexpr int WIDE = 4;        // key blocks / column vectors per micro-tile of a decode task
// Rows per paired-bf16 micro-tile: PAIRED_ROWS x WIDE = 24 accumulators of the 32 zmm registers, so each
// broadcast of a q pair (or probability pair) feeds WIDE dot products and each K/V load PAIRED_ROWS.
constexpr int PAIRED_ROWS = 6;

template <typename T>
struct Batch {
  const T* q;
  int64_t q_stride_t, q_stride_h;
  const T* k_cache;
  const T* v_cache;
  const int64_t* block_tables;
  int64_t table_stride;
  const int64_t* query_start_loc;
  const int64_t* seq_lens;
  T* out;  // [num_tokens, num_heads, head_dim]
  int64_t num_heads, num_kv_heads, head_dim, num_blocks, block_size;
  float scale;
};

struct Task {
  int64_t seq, kv_head, first_query, num_queries, first_pos;  // first_pos: position of the first query
};

template <typename T>
struct Scratch {  // per thread, reused across its tasks
  std::vector<float> q, o, s, max, sum;
  std::vector<uint16_t> q_pairs, p_pairs;  // the paired bf16 path's q rows and probabilities
  std::vector<uint16_t> v_tail;  // the AMX path's last V group of a chunk, keys past its end zeroed
  std::vector<const T*> blocks;  // the current chunk's V blocks, their column panels, its K blocks
  std::vector<const T*> groups;  // the AMX path's 16-key groups of the chunk: K, then V
};

inline void store_probs(float* p, const vf& x) { store(p, x); }
#if defined(__AVX512BF16__)
inline void store_probs(uint16_t* p, const vf& x) {  // rounded to bf16 for the paired P.V, as GPU flash attention does
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(x));
}
#endif

// One online-softmax step for the tile's rows over the chunk of keys [start, start + len): turns the
// scores in s, times `scale`, into probabilities in p (0 where masked, whole vectors: P.V reads them so; p
// may be s) and rescales the running output where the max grows.
template <typename P>
void softmax_step(const float* s, float scale, int64_t lds, int64_t rows, int64_t group, int64_t first_pos,
                  int64_t start, int64_t len, P* p, float* o, int64_t head_dim, float* row_max, float* row_sum) {
  vf lane;
  for (int i = 0; i < W; ++i) lane[i] = static_cast<float>(i);
  const int64_t padded = (len + W - 1) / W * W;
  for (int64_t token = 0, r = 0; r < rows; ++token) {  // rows: tokens x the query heads of the group
    const int64_t visible = std::clamp<int64_t>(first_pos + token + 1 - start, 0, len);  // keys it sees
    const float limit = static_cast<float>(visible);
    const bool masked = visible < len || len % W != 0;  // loop-invariant: the compiler unswitches it
    const int64_t end = (visible + W - 1) / W * W;  // past it, whole vectors of zeros
    for (const int64_t token_end = r + group; r < token_end; ++r) {
      const float* sr = s + r * lds;
      P* pr = p + r * lds;
      vf vmax = splat(-1e30f);
      for (int64_t j = 0; j < visible; j += W) {
        vf x = load<W>(sr + j) * scale;
        if (masked) x = lane + static_cast<float>(j) < limit ? x : -1e30f;
        vmax = x > vmax ? x : vmax;
      }
      const float new_max = std::max(row_max[r], reduce_max(vmax));
      vf vsum = splat(0.0f);
      for (int64_t j = 0; j < end; j += W) {
        // Degree 4 where p is rounded to bf16: its error is far below bf16's and the same in P.V and the sum.
        vf x = exp2_nonpositive<std::is_same_v<P, float> ? 6 : 4>(load<W>(sr + j) * scale - new_max);
        if (masked) x = lane + static_cast<float>(j) < limit ? x : 0.0f;
        store_probs(pr + j, x);
        vsum += x;
      }
      std::fill(pr + end, pr + padded, P{});
      if (new_max > row_max[r]) {
        const float alpha = exp2_nonpositive(splat(row_max[r] - new_max))[0];
        for (int64_t d = 0; d < head_dim; ++d) o[r * head_dim + d] *= alpha;
        row_sum[r] *= alpha;
        row_max[r] = new_max;
      }
      row_sum[r] += reduce_sum(vsum);
    }
  }
}

// The cache holds bf16 K/V blocks in pairs (attention_tiles.h) where the CPU has AVX512-BF16 and blocks are
// whole 16-key vectors; write_cache and attend agree through this.
template <typename T>
bool paired_layout(int64_t block_size) {
  return PAIRED_BF16 && std::is_same_v<T, uint16_t> && block_size % 16 == 0;
}

#if defined(__AVX512BF16__)
// Q.K^T of one chunk on the paired layout: s[rows][keys of the chunk] from its K blocks.
inline void qk_chunk_paired(const uint16_t* q, int64_t rows, int64_t D, const uint16_t* const* k_blocks,
                            int64_t num_blocks, int64_t bs, float scale, float* s, int64_t lds,
                            const uint16_t** vectors) {
  const int64_t per_block = bs / 16, num_vectors = num_blocks * per_block;
  for (int64_t b = 0; b < num_blocks; ++b)
    for (int64_t i = 0; i < per_block; ++i) vectors[b * per_block + i] = k_blocks[b] + i * 32;
  for (int64_t r0 = 0; r0 < rows; r0 += PAIRED_ROWS) {
    with_rows<PAIRED_ROWS>(std::min<int64_t>(PAIRED_ROWS, rows - r0), [&](auto R) {
      int64_t i = 0;
      for (; i + WIDE <= num_vectors; i += WIDE)
        qk_tile_paired<R.value, WIDE>(q + r0 * D, D, vectors + i, 2 * bs, scale, s + r0 * lds + i * 16, lds);
      for (; i < num_vectors; ++i)
        qk_tile_paired<R.value, 1>(q + r0 * D, D, vectors + i, 2 * bs, scale, s + r0 * lds + i * 16, lds);
    });
  }
}

// P.V of one chunk on the paired layout from softmax_step's bf16 probabilities.
inline void pv_chunk_paired(const uint16_t* p, int64_t rows, int64_t lds, int64_t len, const uint16_t* const* v_blocks,
                            int64_t bs, int64_t D, float* o) {
  const bool wide = D % (WIDE * 16) == 0;
  for (int64_t col = 0; col < D; col += wide ? WIDE * 16 : 16) {
    for (int64_t r0 = 0; r0 < rows; r0 += PAIRED_ROWS) {
      with_rows<PAIRED_ROWS>(std::min<int64_t>(PAIRED_ROWS, rows - r0), [&](auto R) {
        if (wide) {
          pv_tile_paired<R.value, WIDE>(p + r0 * lds, lds, v_blocks, col, bs, len, D, o + r0 * D + col);
        } else {
          pv_tile_paired<R.value, 1>(p + r0 * lds, lds, v_blocks, col, bs, len, D, o + r0 * D + col);
        }
      });
    }
  }
}
#endif

inline bool amx_ready() {
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
  return amx_permitted();
#else
  return false;
#endif
}

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
// One chunk of keys [start, start + len) of a task on AMX: Q.K^T, the online-softmax step, P.V.
template <typename T>
void attend_chunk_amx(Scratch<T>& scratch, int64_t rows, int64_t padded_rows, int64_t group, int64_t first_pos,
                      int64_t start, int64_t len, const uint16_t* const* k_blocks, const uint16_t* const* v_blocks,
                      int64_t bs, int64_t D, int64_t lds, float q_scale) {
  const int64_t per_block = bs / 16, num_groups = (len + 15) / 16;
  const uint16_t** k_groups = scratch.groups.data();
  const uint16_t** v_groups = k_groups + scratch.groups.size() / 2;
  for (int64_t i = 0; i < num_groups; ++i) {
    k_groups[i] = k_blocks[i / per_block] + i % per_block * 32;  // 16 keys' pairs within each pair row
    v_groups[i] = v_blocks[i / per_block] + i % per_block * 16 * D;  // 8 pair rows of 2 x D
  }
  if (len % 16) {  // slots past the sequence hold stale values: zero them, as P.V multiplies them by 0
    uint16_t* tail = scratch.v_tail.data();
    std::memcpy(tail, v_groups[num_groups - 1], 16 * D * sizeof(uint16_t));
    for (int64_t key = len % 16; key < 16; ++key)
      for (int64_t d = 0; d < D; ++d) tail[(key / 2 * D + d) * 2 + key % 2] = 0;
    v_groups[num_groups - 1] = tail;
  }
  float* s = scratch.s.data();
  qk_chunk_amx(scratch.q_pairs.data(), padded_rows, D, k_groups, num_groups, 2 * bs, s, lds);
  uint16_t* p = scratch.p_pairs.data();
  softmax_step(s, q_scale, lds, rows, group, first_pos, start, len, p, scratch.o.data(), D, scratch.max.data(),
               scratch.sum.data());
  pv_chunk_amx(p, padded_rows, lds, v_groups, num_groups, D, scratch.o.data());
}
#endif

template <typename T, int N>
void attend(const Batch<T>& batch, const Task& task, Scratch<T>& scratch) {
  const int64_t D = batch.head_dim, bs = batch.block_size, group = batch.num_heads / batch.num_kv_heads;
  const int64_t rows = task.num_queries * group, num_keys = task.first_pos + task.num_queries;
  const int64_t blocks_per_chunk = std::max<int64_t>(1, KEY_CHUNK / bs), chunk = blocks_per_chunk * bs;
  const int64_t lds = (chunk + W - 1) / W * W;
  const bool paired = paired_layout<T>(bs);
  const bool amx = paired && AMX_BF16 && rows >= 16 && D % 32 == 0 && amx_ready();
  const int64_t padded_rows = amx ? (rows + 15) / 16 * 16 : rows;  // AMX tiles take 16 rows
  scratch.q.resize(rows * D);
  scratch.o.assign(padded_rows * D, 0.0f);
  scratch.s.resize(padded_rows * lds);
  scratch.max.assign(rows, -1e30f);
  scratch.sum.assign(rows, 0.0f);
  float *q = scratch.q.data(), *o = scratch.o.data(), *s = scratch.s.data();

  const float q_scale = batch.scale * 1.4426950408889634f;  // scores in log2 units: the softmax uses 2^x
  if (paired) {
    scratch.q_pairs.resize(padded_rows * D);
    std::fill(scratch.q_pairs.begin() + rows * D, scratch.q_pairs.end(), 0);  // the padding rows
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = batch.q + (task.first_query + r / group) * batch.q_stride_t
                   + (task.kv_head * group + r % group) * batch.q_stride_h;
    if (paired) {
      std::memcpy(scratch.q_pairs.data() + r * D, src, D * sizeof(T));
    } else {
      for (int64_t d = 0; d < D; ++d) q[r * D + d] = to_float(src[d]) * q_scale;
    }
  }
  if (paired) {
    scratch.p_pairs.resize(padded_rows * lds);
    std::fill(scratch.p_pairs.begin() + rows * lds, scratch.p_pairs.end(), 0);
    scratch.blocks.resize(4 * blocks_per_chunk * (bs / 16 + 1));
  }
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
  if (amx) {
    scratch.groups.resize(2 * chunk / 16);
    scratch.v_tail.resize(16 * D);
    _tile_loadconfig(&ATTENTION_TILES);  // per task: oneDNN's kernels configure the same threads' tiles their own way
  }
#endif
  const int64_t head_offset = task.kv_head * batch.num_blocks * bs * D;
  const int64_t* table = batch.block_tables + task.seq * batch.table_stride;
  if (!paired) scratch.blocks.resize(3 * blocks_per_chunk);
  const T** v_blocks = scratch.blocks.data();
  const T** panels = v_blocks + blocks_per_chunk;
  const T** k_blocks = panels + blocks_per_chunk;
  // A decode task's rows (one token x the GQA group) are too few to hide the FMA latency: its micro-tiles
  // take WIDE key blocks / column vectors at once.
  const bool few_rows = rows <= MAX_ROWS / WIDE && bs == W;
  const int64_t block_bytes = bs * D * sizeof(T);
  for (int64_t start = 0; start < num_keys; start += chunk) {
    const int64_t len = std::min(chunk, num_keys - start), num_blocks = (len + bs - 1) / bs;
    // The next chunk's K and V blocks lie anywhere in the cache: a hardware prefetcher cannot guess the
    // jump, so a decode step (two 2 KB reads per 16 keys) would wait on DRAM at every block. The first
    // chunk is fetched with the second: its demand loads alone would come one block at a time.
    for (int64_t key = start == 0 ? 0 : start + chunk; key < std::min(start + 2 * chunk, num_keys); key += bs) {
      const int64_t offset = head_offset + table[key / bs] * bs * D;
      const char* k = reinterpret_cast<const char*>(batch.k_cache + offset);
      const char* v = reinterpret_cast<const char*>(batch.v_cache + offset);
      for (int64_t line = 0; line < block_bytes; line += 64) {
        __builtin_prefetch(k + line);
        __builtin_prefetch(v + line);
      }
    }
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t block = table[start / bs + b];
      const T* kt = batch.k_cache + head_offset + block * bs * D;
      k_blocks[b] = kt;
      v_blocks[b] = batch.v_cache + head_offset + block * bs * D;
      if (few_rows || paired) continue;
      for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
        with_rows(std::min<int64_t>(MAX_ROWS, rows - r0), [&](auto R) {
          for (int64_t c = 0; c < bs; c += N)
            qk_tile<R.value, N>(q + r0 * D, D, kt + c, bs, s + r0 * lds + b * bs + c, lds);
        });
      }
    }
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (amx) {
        attend_chunk_amx(scratch, rows, padded_rows, group, task.first_pos, start, len, k_blocks, v_blocks, bs, D,
                         lds, q_scale);
        continue;
      }
    }
#endif
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (paired) {
        qk_chunk_paired(scratch.q_pairs.data(), rows, D, k_blocks, num_blocks, bs, q_scale, s, lds,
                        k_blocks + blocks_per_chunk);
        uint16_t* p = scratch.p_pairs.data();
        softmax_step(s, 1.0f, lds, rows, group, task.first_pos, start, len, p, o, D, scratch.max.data(), scratch.sum.data());
        pv_chunk_paired(p, rows, lds, len, v_blocks, bs, D, o);
        continue;
      }
    }
#endif
    if (few_rows) {
      with_rows<MAX_ROWS / WIDE>(rows, [&](auto R) {
        int64_t b = 0;
        for (; b + WIDE <= num_blocks; b += WIDE) qk_tile_blocks<R.value, WIDE>(q, D, k_blocks + b, s + b * bs, lds);
        for (; b < num_blocks; ++b) qk_tile_blocks<R.value, 1>(q, D, k_blocks + b, s + b * bs, lds);
      });
    }
    softmax_step(s, 1.0f, lds, rows, group, task.first_pos, start, len, s, o, D, scratch.max.data(), scratch.sum.data());
    if (few_rows && D % (WIDE * W) == 0) {
      for (int64_t col = 0; col < D; col += WIDE * W) {
        for (int64_t i = 0; i < num_blocks; ++i) panels[i] = v_blocks[i] + col;
        with_rows<MAX_ROWS / WIDE>(rows, [&](auto R) { pv_tile<R.value, WIDE>(s, lds, panels, bs, len, D, o + col); });
      }
      continue;
    }
    // Column panels outer: each panel of the chunk's V rows stays in L1 while every row tile reads it.
    for (int64_t col = 0; col < D; col += COLS) {
      for (int64_t i = 0; i < num_blocks; ++i) panels[i] = v_blocks[i] + col;
      for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
        with_rows(std::min<int64_t>(MAX_ROWS, rows - r0), [&](auto R) {
          pv_tile<R.value>(s + r0 * lds, lds, panels, bs, len, D, o + r0 * D + col);
        });
      }
    }
  }
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
  if (amx) _tile_release();
#endif
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = batch.out + ((task.first_query + r / group) * batch.num_heads + task.kv_head * group + r % group) * D;
    const float inv = 1.0f / scratch.sum[r];
    for (int64_t d = 0; d < D; ++d) store_scalar(dst + d, o[r * D + d] * inv);
  }
}

template <typename T>
void paged_attention(const Batch<T>& batch, int64_t num_seqs, int num_threads) {
  const int64_t group = batch.num_heads / batch.num_kv_heads;
  const int64_t tile = std::max<int64_t>(1, TILE_ROWS / group);
  std::vector<Task> tasks;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t begin = batch.query_start_loc[seq], num_queries = batch.query_start_loc[seq + 1] - begin;
    const int64_t context = batch.seq_lens[seq] - num_queries;
    for (int64_t i = 0; i < num_queries; i += tile) {
      for (int64_t h = 0; h < batch.num_kv_heads; ++h)
        tasks.push_back({seq, h, begin + i, std::min(tile, num_queries - i), context + i});
    }
  }
  // Longest first (a task's cost grows with the keys it reads), so no thread is left with a long tail.
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) {
    return a.first_pos + a.num_queries > b.first_pos + b.num_queries;
  });
  // Keys per Q.K^T micro-tile: 16 for the usual block sizes; 4 or 1 keep other sizes working (three
  // instantiations, not five: the build time grows with each).
  const int64_t bs = batch.block_size;
  const int key_group = bs % 16 == 0 ? 16 : bs % 4 == 0 ? 4 : 1;
#pragma omp parallel num_threads(num_threads)
  {
    Scratch<T> scratch;
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < tasks.size(); ++i) {
      switch (key_group) {
        case 16: attend<T, 16>(batch, tasks[i], scratch); break;
        case 4: attend<T, 4>(batch, tasks[i], scratch); break;
        default: attend<T, 1>(batch, tasks[i], scratch);
      }
    }
  }
}

// Writes each token's new K (transposed into its block, or in pairs of dims) and V (or in pairs of keys) at
// its slot.
template <typename T>
void write_cache(const T* k, int64_t k_stride_t, const T* v, int64_t v_stride_t, T* k_cache, T* v_cache,
                 const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim,
                 int64_t num_blocks, int64_t block_size, int num_threads) {
  const bool paired = paired_layout<T>(block_size);
#if defined(__AVX512BF16__)
  // The vector path's K scatter: pair row i of a block lies i * block_size pairs (32-bit words) on.
  const __m512i pair_rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(static_cast<int>(block_size)));
#endif
#pragma omp parallel for num_threads(num_threads) if (num_tokens >= 64)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t block = slot_mapping[t] / block_size, offset = slot_mapping[t] % block_size;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const int64_t base = (h * num_blocks + block) * block_size * head_dim;
      const T* src = k + t * k_stride_t + h * head_dim;
      if (paired) {
        const T* v_src = v + t * v_stride_t + h * head_dim;
#if defined(__AVX512BF16__)
        if (head_dim % 32 == 0) {  // 16 dim pairs (K) and 32 dims (V) per vector: 3x the rate of the loop below
          const __mmask32 half = offset % 2 ? 0xAAAAAAAA : 0x55555555;  // V: this key's element of each pair
          const int shift = offset % 2 ? 16 : 0;
          T* v_row = v_cache + base + offset / 2 * head_dim * 2;
          for (int64_t d = 0; d < head_dim; d += 32) {
            // K: dims d, d+1 (one 32-bit pair) go to pair row d / 2 at this key's slot
            _mm512_i32scatter_epi32(k_cache + base + (d / 2 * block_size + offset) * 2,
                                    pair_rows, _mm512_loadu_si512(src + d), 4);
            // V: dim d of this key sits at element 2 d (+1 for an odd key) of its pair row
            const __m512i dims = _mm512_loadu_si512(v_src + d);
            const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(dims));
            const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(dims, 1));
            _mm512_mask_storeu_epi16(v_row + 2 * d, half, _mm512_slli_epi32(lo, shift));
            _mm512_mask_storeu_epi16(v_row + 2 * d + 32, half, _mm512_slli_epi32(hi, shift));
          }
          continue;
        }
#endif
        for (int64_t d = 0; d < head_dim; ++d) {
          k_cache[base + (d / 2 * block_size + offset) * 2 + d % 2] = src[d];
          v_cache[base + (offset / 2 * head_dim + d) * 2 + offset % 2] = v_src[d];
        }
        continue;
      }
      for (int64_t d = 0; d < head_dim; ++d) k_cache[base + d * block_size + offset] = src[d];
      std::memcpy(v_cache + base + offset * head_dim, v + t * v_stride_t + h * head_dim, head_dim * sizeof(T));
    }
  }
}

}  // namespace

// Both return 0, or 1 when head_dim is not a multiple of 16 (HEAD_DIM_MULTIPLE in native.py).
#define DEFINE_KERNELS(SUFFIX, T)                                                                           \
  extern "C" int paged_attention_##SUFFIX(                                                                 \
      const T* q, int64_t q_stride_t, int64_t q_stride_h, const T* k_cache, const T* v_cache,              \
      const int64_t* block_tables, int64_t table_stride, const int64_t* query_start_loc,                   \
      const int64_t* seq_lens, int64_t num_seqs, T* out, int64_t num_heads, int64_t num_kv_heads,          \
      int64_t head_dim, int64_t num_blocks, int64_t block_size, float scale, int num_threads) {             \
    if (head_dim % COLS != 0) return 1;                                                                       \
    const Batch<T> batch{q, q_stride_t, q_stride_h, k_cache, v_cache, block_tables, table_stride,          \
                         query_start_loc, seq_lens, out, num_heads, num_kv_heads, head_dim, num_blocks,   \
                         block_size, scale};                                                              \
    paged_attention(batch, num_seqs, num_threads);                                                         \
    return 0;                                                                                              \
  }                                                                                                        \
  extern "C" int write_cache_##SUFFIX(const T* k, int64_t k_stride_t, const T* v, int64_t v_stride_t,      \
                                      T* k_cache, T* v_cache, const int64_t* slot_mapping,                 \
                                      int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim,          \
                                      int64_t num_blocks, int64_t block_size, int num_threads) {           \
    write_cache(k, k_stride_t, v, v_stride_t, k_cache, v_cache, slot_mapping, num_tokens, num_kv_heads,   \
                head_dim, num_blocks, block_size, num_threads);                                            \
    return 0;                                                                                              \
  }

DEFINE_KERNELS(bf16, uint16_t)
DEFINE_KERNELS(f32, float)
