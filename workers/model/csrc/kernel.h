// The paged-attention kernel's plain-pointer interface (ops.cpp validates and fills it).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace kvserve {

// One call's inputs. Strides are in elements; the cache is
// [num_blocks, 2, block_tokens, kv_heads, head_dim], contiguous.
struct AttnProblem {
  const void* q = nullptr;  // [T, q_heads, head_dim], last dim contiguous
  int64_t q_stride_t = 0;
  int64_t q_stride_h = 0;
  void* out = nullptr;  // like q, same dtype
  int64_t out_stride_t = 0;
  int64_t out_stride_h = 0;
  c10::ScalarType q_dtype = c10::ScalarType::Float;
  const void* cache = nullptr;
  c10::ScalarType cache_dtype = c10::ScalarType::Float;
  int64_t block_tokens = 0;
  int64_t kv_heads = 0;
  int64_t q_heads = 0;
  int64_t head_dim = 0;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks], contiguous
  int64_t max_blocks = 0;
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* query_starts = nullptr;  // [num_seqs + 1]
  int64_t num_seqs = 0;
  float scale = 1.0f;
};

// Computes attention for every sequence with queries; uses at::parallel_for. Inputs must
// already be validated (page ids in range, context_lens >= query counts, ...).
void paged_attention_cpu(const AttnProblem& p);

}  // namespace kvserve
