// Micro-kernels of one work item: a tile of queries (all q heads of one kv head) against a
// range of cached tokens, with an online softmax. Every K/V row is loaded once per tile and
// used by all of the tile's rows (queries x GQA group).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "simd.h"

namespace kvserve {

// Per-thread working memory and the running state of one tile's rows.
struct TileState {
  int rows = 0;         // queries x group heads
  int64_t ld = 0;       // row stride of q/acc: head_dim rounded up to kW
  int64_t lds = 0;      // row stride of s: block_tokens rounded up to kW
  float* q = nullptr;   // [rows, ld] scaled queries (zero padded)
  float* acc = nullptr; // [rows, ld] unnormalized output
  float* s = nullptr;   // [rows, lds] scores, then probabilities
  float* m = nullptr;   // [rows] running max
  float* l = nullptr;   // [rows] running sum
  int* pos = nullptr;   // [rows] the query's position
};

// s[r, j] = q[r] . k[j] for RB rows and TB tokens.
template <int RB, int TB, typename K>
inline void dot_tile(const float* q, int64_t ldq, const K* k, int64_t ldk, int nvec, float* s,
                     int64_t lds) {
  vf acc[RB][TB] = {};
  for (int v = 0; v < nvec; ++v) {
    vf kv[TB];
    for (int t = 0; t < TB; ++t) {
      const K* src = k + t * ldk + v * kW;
      kv[t] = RB > 1 ? vpinned(vload(src)) : vload(src);
    }
    for (int r = 0; r < RB; ++r) {
      const float* src = q + r * ldq + v * kW;
      const vf qv = TB > 1 ? vpinned(vload(src)) : vload(src);
      for (int t = 0; t < TB; ++t) acc[r][t] += qv * kv[t];
    }
  }
  if constexpr (RB * TB * 2 >= kW) {
    static_assert(RB * TB <= kW);
    vf flat[kW] = {};
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) flat[r * TB + t] = acc[r][t];
    const vf sums = reduce_lanes(flat);
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) s[r * lds + t] = sums[r * TB + t];
  } else {
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) s[r * lds + t] = hsum(acc[r][t]);
  }
}

// Brings rows [j, j + count) of the next chunk's K and V into the cache: pages are scattered
// in memory, so the hardware prefetcher restarts at every one (measured: 2x faster decode of
// 16 sequences x 512 tokens whose K/V are not in L2, ~10% slower when they are).
template <typename K>
inline void prefetch_rows(const K* k, const K* v, int64_t ld, int j, int count, int nvec) {
  constexpr int kLine = 64;
  const int bytes = nvec * kW * static_cast<int>(sizeof(K));
  for (int t = j; t < j + count; ++t) {
    const char* kr = reinterpret_cast<const char*>(k + t * ld);
    const char* vr = reinterpret_cast<const char*>(v + t * ld);
    for (int b = 0; b < bytes; b += kLine) {
      __builtin_prefetch(kr + b, 0, 3);
      __builtin_prefetch(vr + b, 0, 3);
    }
  }
}

// Scores of rows [r0, r0 + RB) against the block's first n tokens; prefetches the next
// block's rows along the way when next_k is set.
template <int RB, typename K>
inline void dot_rows(const TileState& st, int r0, const K* k, int64_t ldk, int n, int nvec,
                     const K* next_k, const K* next_v, int next_n) {
  constexpr int TB = kW / RB;  // RB x TB sums fill one vector
  const float* q = st.q + r0 * st.ld;
  float* s = st.s + r0 * st.lds;
  int j = 0;
  for (; j + TB <= n; j += TB) {
    if (next_k != nullptr && j < next_n)
      prefetch_rows(next_k, next_v, ldk, j, std::min(TB, next_n - j), nvec);
    dot_tile<RB, TB>(q, st.ld, k + j * ldk, ldk, nvec, s + j, st.lds);
  }
  for (; j < n; ++j) dot_tile<RB, 1>(q, st.ld, k + j * ldk, ldk, nvec, s + j, st.lds);
  if (next_k != nullptr && j < next_n) prefetch_rows(next_k, next_v, ldk, j, next_n - j, nvec);
}

// acc[r, v0*kW : (v0+NV)*kW] += sum_j p[r, j] * v[j, same range], for RB rows.
template <int RB, int NV, typename K>
inline void pv_tile(const float* p, int64_t ldp, int n, const K* v, int64_t ldv, float* acc,
                    int64_t lda, int v0) {
  vf a[RB][NV];
  for (int r = 0; r < RB; ++r)
    for (int i = 0; i < NV; ++i) a[r][i] = vload(acc + r * lda + (v0 + i) * kW);
  for (int j = 0; j < n; ++j) {
    vf vv[NV];
    for (int i = 0; i < NV; ++i) {
      const K* src = v + j * ldv + (v0 + i) * kW;
      vv[i] = RB > 1 ? vpinned(vload(src)) : vload(src);
    }
    for (int r = 0; r < RB; ++r) {
      vf pr = vsplat(p[r * ldp + j]);
      for (int i = 0; i < NV; ++i) a[r][i] += pr * vv[i];
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int i = 0; i < NV; ++i) vstore(acc + r * lda + (v0 + i) * kW, a[r][i]);
}

template <int RB, typename K>
inline void pv_rows(const TileState& st, int r0, const K* v, int64_t ldv, int n, int nvec) {
  constexpr int NV = kW >= 16 ? 4 : 2;
  const float* p = st.s + r0 * st.lds;
  float* acc = st.acc + r0 * st.ld;
  int i = 0;
  for (; i + NV <= nvec; i += NV) pv_tile<RB, NV>(p, st.lds, n, v, ldv, acc, st.ld, i);
  for (; i < nvec; ++i) pv_tile<RB, 1>(p, st.lds, n, v, ldv, acc, st.ld, i);
}

// Online-softmax update of row r with its first nv scores of this block (of n computed);
// leaves the block's probabilities in s (zero past nv).
inline void softmax_row(const TileState& st, int r, int nv, int n) {
  float* srow = st.s + r * st.lds;
  if (nv <= 0) {
    std::fill(srow, srow + n, 0.0f);
    return;
  }
  const int nvr = (nv + kW - 1) / kW * kW;
  std::fill(srow + nv, srow + nvr, kNegInf);
  vf mx = vsplat(kNegInf);
  for (int j = 0; j < nvr; j += kW) mx = vmax(mx, vload(srow + j));
  const float m_old = st.m[r];
  const float m_new = std::max(m_old, hmax(mx));
  const vf mv = vsplat(m_new);
  vf sum = {};
  for (int j = 0; j < nvr; j += kW) {
    vf e = vexp(vload(srow + j) - mv);
    vstore(srow + j, e);
    sum += e;
  }
  if (nvr < n) std::fill(srow + nvr, srow + n, 0.0f);
  const float alpha = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
  st.l[r] = st.l[r] * alpha + hsum(sum);
  st.m[r] = m_new;
  if (alpha != 1.0f) {
    float* a = st.acc + r * st.ld;
    const vf av = vsplat(alpha);
    for (int64_t d = 0; d < st.ld; d += kW) vstore(a + d, vload(a + d) * av);
  }
}

// One chunk of tokens [pos0, pos0 + n) (inside one page) for all rows; k/v rows are ld
// elements apart and hold nvec full vectors (head_dim a multiple of kW, or zero padded).
// next_k/next_v/next_n: the following chunk, prefetched meanwhile (next_k may be null).
template <typename K>
void attend_block(const TileState& st, const K* k, const K* v, int64_t ld, int n, int64_t pos0,
                  int nvec, const K* next_k, const K* next_v, int next_n) {
  constexpr int RB = 4;
  for (int r0 = 0; r0 < st.rows; r0 += RB) {
    const int rb = std::min(RB, st.rows - r0);
    // Rows are in position order: the chunk's last row sees the most tokens.
    const int nv = static_cast<int>(std::clamp<int64_t>(st.pos[r0 + rb - 1] + 1 - pos0, 0, n));
    if (nv == 0) continue;
    const K* pk = r0 == 0 ? next_k : nullptr;  // prefetch once per block
    const K* pv = next_v;
    const int pn = next_n;
    switch (rb) {
      case 4: dot_rows<4>(st, r0, k, ld, nv, nvec, pk, pv, pn); break;
      case 3: dot_rows<3>(st, r0, k, ld, nv, nvec, pk, pv, pn); break;
      case 2: dot_rows<2>(st, r0, k, ld, nv, nvec, pk, pv, pn); break;
      default: dot_rows<1>(st, r0, k, ld, nv, nvec, pk, pv, pn); break;
    }
  }
  for (int r = 0; r < st.rows; ++r)
    softmax_row(st, r, static_cast<int>(std::clamp<int64_t>(st.pos[r] + 1 - pos0, 0, n)), n);
  for (int r0 = 0; r0 < st.rows; r0 += RB) {
    const int rb = std::min(RB, st.rows - r0);
    const int nv = static_cast<int>(std::clamp<int64_t>(st.pos[r0 + rb - 1] + 1 - pos0, 0, n));
    if (nv == 0) continue;
    switch (rb) {
      case 4: pv_rows<4>(st, r0, v, ld, nv, nvec); break;
      case 3: pv_rows<3>(st, r0, v, ld, nv, nvec); break;
      case 2: pv_rows<2>(st, r0, v, ld, nv, nvec); break;
      default: pv_rows<1>(st, r0, v, ld, nv, nvec); break;
    }
  }
}

}  // namespace kvserve
