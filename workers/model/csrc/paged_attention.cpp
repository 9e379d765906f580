// Varlen paged attention over a [num_blocks, 2, block_tokens, kv_heads, head_dim] cache.
//
// Work items are (sequence, kv head, tile of queries, range of context). A tile holds up to
// kRowsTarget rows (queries x the kv head's GQA group) so each K/V row, loaded once, serves
// all of them. When there are few items for the threads (decode of a few long sequences),
// single-tile sequences are split along the context (split-K); the partial (max, sum, out)
// triples are merged at the end. Items are handed out dynamically (largest first) from
// inside at::parallel_for, so exactly torch's thread count is used.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "kernel.h"
#include "tile.h"

namespace kvserve {
namespace {

constexpr int kRowsTarget = 32;       // rows (queries x group) per tile
constexpr int64_t kMinSplit = 256;    // fewest context tokens in one split
constexpr int kItemsPerThread = 4;    // split until there are this many items per thread
constexpr int64_t kTokenChunk = 64;   // context tokens per pass of a tile

struct Item {
  int32_t seq, kvh, q0, q1;  // queries [q0, q1) of the sequence
  int64_t t0, t1;            // context tokens [t0, t1)
  int32_t split;             // index of the split, -1 if the sequence is not split
  int64_t cost;
};

struct Plan {
  std::vector<Item> items;
  std::vector<int64_t> part_base;  // per sequence: first partial row, -1 if not split
  std::vector<int32_t> nsplit;     // per sequence
  int64_t part_rows = 0;
  int tile_queries = 1;
};

Plan make_plan(const AttnProblem& p, int nthreads) {
  Plan plan;
  const int64_t group = p.q_heads / p.kv_heads;
  plan.tile_queries = static_cast<int>(std::max<int64_t>(1, kRowsTarget / group));
  const int64_t tq = plan.tile_queries;
  int64_t base_items = 0;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t qlen = p.query_starts[s + 1] - p.query_starts[s];
    base_items += (qlen + tq - 1) / tq * p.kv_heads;
  }
  const int64_t want = static_cast<int64_t>(nthreads) * kItemsPerThread;
  const int64_t splits_wanted =
      (nthreads > 1 && base_items > 0 && base_items < want) ? (want + base_items - 1) / base_items
                                                            : 1;
  plan.part_base.assign(p.num_seqs, -1);
  plan.nsplit.assign(p.num_seqs, 1);
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t qlen = p.query_starts[s + 1] - p.query_starts[s];
    if (qlen <= 0) continue;
    const int64_t ctx = p.context_lens[s];
    int64_t split_len = ctx;
    if (qlen <= tq && splits_wanted > 1) {
      const int64_t n = std::min(splits_wanted, ctx / kMinSplit);
      if (n > 1) {
        split_len = ((ctx + n - 1) / n + p.block_tokens - 1) / p.block_tokens * p.block_tokens;
      }
    }
    const int64_t nsplit = (ctx + split_len - 1) / split_len;
    if (nsplit > 1) {
      plan.nsplit[s] = static_cast<int32_t>(nsplit);
      plan.part_base[s] = plan.part_rows;
      plan.part_rows += nsplit * qlen * p.q_heads;
    }
    for (int64_t q0 = 0; q0 < qlen; q0 += tq) {
      const int64_t q1 = std::min(qlen, q0 + tq);
      const int64_t last_pos = ctx - qlen + q1 - 1;
      for (int64_t c = 0; c < nsplit; ++c) {
        const int64_t t0 = c * split_len;
        const int64_t t1 = std::min(ctx, t0 + split_len);
        const int64_t work = std::max<int64_t>(0, std::min(t1, last_pos + 1) - t0);
        for (int64_t h = 0; h < p.kv_heads; ++h) {
          plan.items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(h),
                                static_cast<int32_t>(q0), static_cast<int32_t>(q1), t0, t1,
                                nsplit > 1 ? static_cast<int32_t>(c) : -1,
                                (q1 - q0) * group * (work + 16)});
        }
      }
    }
  }
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return plan;
}

template <typename T>
void load_row(const void* src, float* dst, int64_t d, int64_t ld, float scale) {
  const T* x = static_cast<const T*>(src);
  for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<float>(x[i]) * scale;
  std::fill(dst + d, dst + ld, 0.0f);
}

void load_row_any(c10::ScalarType dt, const void* src, float* dst, int64_t d, int64_t ld,
                  float scale) {
  switch (dt) {
    case c10::ScalarType::BFloat16: load_row<c10::BFloat16>(src, dst, d, ld, scale); break;
    case c10::ScalarType::Half: load_row<c10::Half>(src, dst, d, ld, scale); break;
    default: load_row<float>(src, dst, d, ld, scale); break;
  }
}

template <typename T>
void store_row(void* dst, const float* src, int64_t d, float scale) {
  T* y = static_cast<T*>(dst);
  for (int64_t i = 0; i < d; ++i) y[i] = static_cast<T>(src[i] * scale);
}

void store_row_any(c10::ScalarType dt, void* dst, const float* src, int64_t d, float scale) {
  switch (dt) {
    case c10::ScalarType::BFloat16: store_row<c10::BFloat16>(dst, src, d, scale); break;
    case c10::ScalarType::Half: store_row<c10::Half>(dst, src, d, scale); break;
    default: store_row<float>(dst, src, d, scale); break;
  }
}

int64_t elem_size(c10::ScalarType dt) { return dt == c10::ScalarType::Float ? 4 : 2; }

struct Workspace {
  std::vector<float> buf;
  std::vector<int> pos;
  TileState st;
  float* kf = nullptr;  // [block_tokens, ld] widened K when head_dim % kW != 0
  float* vf_ = nullptr;

  Workspace(int max_rows, int64_t ld, int64_t lds, int64_t block_tokens, bool padded) {
    const int64_t kv = padded ? 2 * block_tokens * ld : 0;
    buf.assign(2 * max_rows * ld + max_rows * lds + 2 * max_rows + kv, 0.0f);
    pos.assign(max_rows, 0);
    float* b = buf.data();
    st.ld = ld;
    st.lds = lds;
    st.q = b;
    st.acc = b + max_rows * ld;
    st.s = st.acc + max_rows * ld;
    st.m = st.s + max_rows * lds;
    st.l = st.m + max_rows;
    st.pos = pos.data();
    if (padded) {
      kf = st.l + max_rows;
      vf_ = kf + block_tokens * ld;
    }
  }
};

template <typename T>
void run_item(const AttnProblem& p, const Plan& plan, const Item& it, Workspace& ws,
              float* part_ml, float* part_acc) {
  TileState& st = ws.st;
  const int64_t group = p.q_heads / p.kv_heads, d = p.head_dim, bt = p.block_tokens;
  const int64_t qs = p.query_starts[it.seq];
  const int64_t qlen = p.query_starts[it.seq + 1] - qs;
  const int64_t ctx = p.context_lens[it.seq];
  const int nq = it.q1 - it.q0;
  st.rows = static_cast<int>(nq * group);
  const char* qbase = static_cast<const char*>(p.q);
  const int64_t qes = elem_size(p.q_dtype);
  for (int qi = 0; qi < nq; ++qi) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = qi * group + g, h = it.kvh * group + g;
      const int64_t off = (qs + it.q0 + qi) * p.q_stride_t + h * p.q_stride_h;
      load_row_any(p.q_dtype, qbase + off * qes, st.q + r * st.ld, d, st.ld, p.scale);
      std::fill(st.acc + r * st.ld, st.acc + (r + 1) * st.ld, 0.0f);
      st.m[r] = kNegInf;
      st.l[r] = 0.0f;
      st.pos[r] = static_cast<int>(ctx - qlen + it.q0 + qi);
    }
  }
  const int64_t t_end = std::min<int64_t>(it.t1, st.pos[st.rows - 1] + 1);
  const int32_t* table = p.block_tables + it.seq * p.max_blocks;
  const int64_t row = p.kv_heads * d;  // elements between a block's consecutive tokens
  const T* cache = static_cast<const T*>(p.cache);
  const bool padded = d % kW != 0;
  const int nvec = static_cast<int>(st.ld / kW);
  // Walk the context in chunks of at most kTokenChunk tokens inside one page, so a chunk's
  // K and V stay in L1 while all rows use them; prefetch the next chunk meanwhile.
  auto chunk_at = [&](int64_t t, int* n) {
    const int64_t blk = t / bt, j = t - blk * bt;
    *n = static_cast<int>(std::min({bt - j, t_end - t, kTokenChunk}));
    return cache + ((static_cast<int64_t>(table[blk]) * 2 * bt + j) * row + it.kvh * d);
  };
  int n = 0;
  const T* k = it.t0 < t_end ? chunk_at(it.t0, &n) : nullptr;
  for (int64_t t = it.t0; t < t_end;) {
    const T* v = k + bt * row;
    int next_n = 0;
    const T* next_k = t + n < t_end ? chunk_at(t + n, &next_n) : nullptr;
    if (padded) {
      for (int j = 0; j < n; ++j) {
        load_row<T>(k + j * row, ws.kf + j * st.ld, d, st.ld, 1.0f);
        load_row<T>(v + j * row, ws.vf_ + j * st.ld, d, st.ld, 1.0f);
      }
      attend_block<float>(st, ws.kf, ws.vf_, st.ld, n, t, nvec, nullptr, nullptr, 0);
    } else {
      const T* next_v = next_k != nullptr ? next_k + bt * row : nullptr;
      attend_block<T>(st, k, v, row, n, t, nvec, next_k, next_v, next_n);
    }
    t += n;
    k = next_k;
    n = next_n;
  }
  char* obase = static_cast<char*>(p.out);
  for (int qi = 0; qi < nq; ++qi) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = qi * group + g, h = it.kvh * group + g;
      const float* a = st.acc + r * st.ld;
      if (it.split < 0) {
        const int64_t off = (qs + it.q0 + qi) * p.out_stride_t + h * p.out_stride_h;
        store_row_any(p.q_dtype, obase + off * qes, a, d, 1.0f / st.l[r]);
      } else {
        const int64_t pr = plan.part_base[it.seq] +
                           (static_cast<int64_t>(it.split) * qlen + it.q0 + qi) * p.q_heads + h;
        part_ml[2 * pr] = st.m[r];
        part_ml[2 * pr + 1] = st.l[r];
        std::copy(a, a + d, part_acc + pr * d);
      }
    }
  }
}

// Merges the splits of sequence s, query qi, head h into out.
void merge_splits(const AttnProblem& p, const Plan& plan, int64_t s, int64_t qi, int64_t h,
                  const float* part_ml, const float* part_acc, float* tmp) {
  const int64_t qs = p.query_starts[s], qlen = p.query_starts[s + 1] - qs, d = p.head_dim;
  const int64_t n = plan.nsplit[s];
  auto prow = [&](int64_t c) { return plan.part_base[s] + (c * qlen + qi) * p.q_heads + h; };
  float m = kNegInf;
  for (int64_t c = 0; c < n; ++c) m = std::max(m, part_ml[2 * prow(c)]);
  std::fill(tmp, tmp + d, 0.0f);
  float l = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    const int64_t pr = prow(c);
    if (part_ml[2 * pr] == kNegInf) continue;  // the split lies past this query
    const float w = std::exp(part_ml[2 * pr] - m);
    l += w * part_ml[2 * pr + 1];
    const float* a = part_acc + pr * d;
    for (int64_t i = 0; i < d; ++i) tmp[i] += w * a[i];
  }
  const int64_t off = (qs + qi) * p.out_stride_t + h * p.out_stride_h;
  store_row_any(p.q_dtype, static_cast<char*>(p.out) + off * elem_size(p.q_dtype), tmp, d,
                1.0f / l);
}

template <typename T>
void run(const AttnProblem& p) {
  const int nthreads = std::max(1, at::get_num_threads());
  const Plan plan = make_plan(p, nthreads);
  if (plan.items.empty()) return;
  const int64_t group = p.q_heads / p.kv_heads;
  const int max_rows = static_cast<int>(plan.tile_queries * group);
  const int64_t ld = (p.head_dim + kW - 1) / kW * kW;
  const int64_t lds = (p.block_tokens + kW - 1) / kW * kW;
  std::vector<float> part_ml(2 * plan.part_rows), part_acc(plan.part_rows * p.head_dim);
  const int64_t nitems = static_cast<int64_t>(plan.items.size());
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(nthreads, nitems);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    Workspace ws(max_rows, ld, lds, p.block_tokens, p.head_dim % kW != 0);
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < nitems;) {
      run_item<T>(p, plan, plan.items[i], ws, part_ml.data(), part_acc.data());
    }
  });
  if (plan.part_rows == 0) return;
  // Merge: one task per (split sequence, query, q head).
  std::vector<int64_t> rows;  // (s, qi) pairs flattened as s * 2^32 + qi
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    if (plan.part_base[s] < 0) continue;
    const int64_t qlen = p.query_starts[s + 1] - p.query_starts[s];
    for (int64_t qi = 0; qi < qlen; ++qi) rows.push_back((s << 32) | qi);
  }
  const int64_t tasks = static_cast<int64_t>(rows.size()) * p.q_heads;
  at::parallel_for(0, tasks, 16, [&](int64_t b, int64_t e) {
    std::vector<float> tmp(p.head_dim);
    for (int64_t i = b; i < e; ++i) {
      const int64_t sq = rows[i / p.q_heads];
      merge_splits(p, plan, sq >> 32, sq & 0xffffffff, i % p.q_heads, part_ml.data(),
                   part_acc.data(), tmp.data());
    }
  });
}

}  // namespace

void paged_attention_cpu(const AttnProblem& p) {
  switch (p.cache_dtype) {
    case c10::ScalarType::BFloat16: run<c10::BFloat16>(p); break;
    case c10::ScalarType::Half: run<c10::Half>(p); break;
    default: run<float>(p); break;
  }
}

}  // namespace kvserve
