// The entry points that decoder_layer.cpp calls (bf16, and fp32 for the widened layer), declared once: the files
// that define them include this too, so a signature that drifts from its definition does not compile.
#pragma once

#include <cstdint>

extern "C" {
int rms_norm_bf16(const uint16_t* x, int64_t x_stride, uint16_t* residual, uint16_t* out, const uint16_t* weight,
                  int64_t rows, int64_t dim, float eps, int add, int num_threads);
int rotary_bf16(uint16_t* q, int64_t q_stride, int64_t num_q_heads, uint16_t* k, int64_t k_stride,
                int64_t num_k_heads, const uint16_t* cos, const uint16_t* sin, int64_t tokens, int64_t head_dim,
                int num_threads);
int write_cache_bf16(const uint16_t* k, int64_t k_stride_t, const uint16_t* v, int64_t v_stride_t,
                     uint16_t* k_cache, uint16_t* v_cache, const int64_t* slot_mapping, int64_t num_tokens,
                     int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
                     int num_threads);
int paged_attention_bf16(const uint16_t* q, int64_t q_stride_t, int64_t q_stride_h, const uint16_t* k_cache,
                         const uint16_t* v_cache, const int64_t* block_tables, int64_t table_stride,
                         const int64_t* query_start_loc, const int64_t* seq_lens, int64_t num_seqs, uint16_t* out,
                         int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                         int64_t block_size, float scale, int num_threads);
int rms_norm_f32(const float* x, int64_t x_stride, float* residual, float* out, const float* weight, int64_t rows,
                 int64_t dim, float eps, int add, int num_threads);
int rotary_f32(float* q, int64_t q_stride, int64_t num_q_heads, float* k, int64_t k_stride, int64_t num_k_heads,
               const float* cos, const float* sin, int64_t tokens, int64_t head_dim, int num_threads);
int silu_and_mul_f32(const float* gate_up, float* out, int64_t rows, int64_t dim, int num_threads);
int write_cache_f32(const float* k, int64_t k_stride_t, const float* v, int64_t v_stride_t, float* k_cache,
                    float* v_cache, const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                    int64_t head_dim, int64_t num_blocks, int64_t block_size, int num_threads);
int paged_attention_f32(const float* q, int64_t q_stride_t, int64_t q_stride_h, const float* k_cache,
                        const float* v_cache, const int64_t* block_tables, int64_t table_stride,
                        const int64_t* query_start_loc, const int64_t* seq_lens, int64_t num_seqs, float* out,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                        int64_t block_size, float scale, int num_threads);
int linear_widened_f32(const float* x, int64_t M, int64_t K, const uint16_t* packed, int64_t N, const float* bias,
                       float* y, int num_threads);
// epilogue: 0 bf16, 1 SiLU-and-mul, 2 fp32 (Epilogue in linear_tiled.h)
int linear_tiled_bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                    const uint16_t* bias, int epilogue, void* y, int num_threads);
}
