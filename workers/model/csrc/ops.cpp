// Python bindings: argument checks, write_kv, the call into the attention kernel, and the
// fused pointwise ops (pointwise.cpp).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernel.h"
#include "pointwise.h"
#include "simd.h"

namespace kvserve {
namespace {

bool is_float_type(c10::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

void check_cache(const at::Tensor& cache) {
  TORCH_CHECK(cache.device().is_cpu(), "layer_cache must be on the CPU");
  TORCH_CHECK(cache.dim() == 5 && cache.size(1) == 2,
              "layer_cache must be [num_blocks, 2, block_tokens, kv_heads, head_dim], got ",
              cache.sizes());
  TORCH_CHECK(cache.is_contiguous(), "layer_cache must be contiguous");
  TORCH_CHECK(is_float_type(cache.scalar_type()),
              "layer_cache must be float32, bfloat16 or float16, got ", cache.scalar_type());
}

void check_int(const at::Tensor& t, const char* name, c10::ScalarType dt, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == dt, name, " must be ", dt, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimension(s), got ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void write_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& layer_cache,
              const at::Tensor& slot_mapping) {
  check_cache(layer_cache);
  check_int(slot_mapping, "slot_mapping", at::kLong, 1);
  const int64_t nb = layer_cache.size(0), bt = layer_cache.size(2);
  const int64_t hkv = layer_cache.size(3), d = layer_cache.size(4);
  const int64_t tokens = slot_mapping.size(0);
  for (const at::Tensor* x : {&k, &v}) {
    TORCH_CHECK(x->device().is_cpu(), "k and v must be on the CPU");
    TORCH_CHECK(x->dim() == 3 && x->size(0) == tokens && x->size(1) == hkv && x->size(2) == d,
                "k and v must be [T, kv_heads, head_dim] = [", tokens, ", ", hkv, ", ", d,
                "], got ", x->sizes());
    TORCH_CHECK(x->scalar_type() == layer_cache.scalar_type(), "k and v must have the cache's "
                "dtype ", layer_cache.scalar_type(), ", got ", x->scalar_type());
  }
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] < nb * bt, "slot_mapping[", t, "] = ", slots[t], " is past the cache's ",
                nb * bt, " slots");
  }
  const int64_t es = layer_cache.element_size();
  char* cache = static_cast<char*>(layer_cache.data_ptr());
  const int64_t row = hkv * d * es;  // bytes of one token's K (or V) in a block
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(row, 1));
  for (int which = 0; which < 2; ++which) {
    const at::Tensor& x = which == 0 ? k : v;
    const char* src = static_cast<const char*>(x.data_ptr());
    const int64_t st = x.stride(0) * es, sh = x.stride(1) * es, sd = x.stride(2) * es;
    at::parallel_for(0, tokens, grain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        if (slots[t] < 0) continue;
        const int64_t page = slots[t] / bt, off = slots[t] % bt;
        char* dst = cache + ((page * 2 + which) * bt + off) * row;
        const char* s = src + t * st;
        if (sd == es && sh == d * es) {
          std::memcpy(dst, s, row);
        } else if (sd == es) {
          for (int64_t h = 0; h < hkv; ++h) std::memcpy(dst + h * d * es, s + h * sh, d * es);
        } else {
          for (int64_t h = 0; h < hkv; ++h)
            for (int64_t i = 0; i < d; ++i)
              std::memcpy(dst + (h * d + i) * es, s + h * sh + i * sd, es);
        }
      }
    });
  }
}

void paged_attention(const at::Tensor& out, const at::Tensor& q, const at::Tensor& layer_cache,
                     const at::Tensor& block_tables, const at::Tensor& context_lens,
                     const at::Tensor& query_starts, double scale) {
  check_cache(layer_cache);
  check_int(block_tables, "block_tables", at::kInt, 2);
  check_int(context_lens, "context_lens", at::kInt, 1);
  check_int(query_starts, "query_starts", at::kInt, 1);
  const int64_t nb = layer_cache.size(0), bt = layer_cache.size(2);
  const int64_t hkv = layer_cache.size(3), d = layer_cache.size(4);
  TORCH_CHECK(q.device().is_cpu() && out.device().is_cpu(), "q and out must be on the CPU");
  TORCH_CHECK(is_float_type(q.scalar_type()), "q must be float32, bfloat16 or float16, got ",
              q.scalar_type());
  TORCH_CHECK(q.dim() == 3 && q.size(2) == d, "q must be [T, q_heads, head_dim=", d, "], got ",
              q.sizes());
  TORCH_CHECK(q.size(1) > 0 && q.size(1) % hkv == 0, "q_heads (", q.size(1),
              ") must be a positive multiple of kv_heads (", hkv, ")");
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "out must match q's shape and dtype: ", q.sizes(), " ", q.scalar_type(), ", got ",
              out.sizes(), " ", out.scalar_type());
  TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1,
              "q and out must be contiguous in their last dimension");
  TORCH_CHECK(std::isfinite(scale), "scale must be finite, got ", scale);
  const int64_t nseq = context_lens.size(0), width = block_tables.size(1);
  TORCH_CHECK(block_tables.size(0) == nseq, "block_tables must have one row per sequence (",
              nseq, "), got ", block_tables.size(0));
  TORCH_CHECK(query_starts.size(0) == nseq + 1, "query_starts must have num_seqs + 1 = ",
              nseq + 1, " entries, got ", query_starts.size(0));
  const int32_t* qs = query_starts.data_ptr<int32_t>();
  const int32_t* cl = context_lens.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  TORCH_CHECK(nseq == 0 || (qs[0] >= 0 && qs[nseq] <= q.size(0)), "query_starts must lie in [0, ",
              q.size(0), "]");
  for (int64_t s = 0; s < nseq; ++s) {
    const int64_t qlen = qs[s + 1] - qs[s];
    TORCH_CHECK(qlen >= 0, "query_starts must be non-decreasing (sequence ", s, ")");
    if (qlen == 0) continue;
    TORCH_CHECK(cl[s] >= qlen, "context_lens[", s, "] = ", cl[s], " is less than its ", qlen,
                " queries (the new tokens must already be counted and written)");
    const int64_t pages = (cl[s] + bt - 1) / bt;
    TORCH_CHECK(pages <= width, "sequence ", s, " needs ", pages, " pages for ", cl[s],
                " tokens but block_tables has ", width, " columns");
    for (int64_t i = 0; i < pages; ++i) {
      const int32_t page = tables[s * width + i];
      TORCH_CHECK(page >= 0 && page < nb, "block_tables[", s, ", ", i, "] = ", page,
                  " is not a page of the cache (", nb, " pages)");
    }
  }
  AttnProblem p;
  p.q = q.data_ptr();
  p.q_stride_t = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.out = out.data_ptr();
  p.out_stride_t = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.q_dtype = q.scalar_type();
  p.cache = layer_cache.data_ptr();
  p.cache_dtype = layer_cache.scalar_type();
  p.block_tokens = bt;
  p.kv_heads = hkv;
  p.q_heads = q.size(1);
  p.head_dim = d;
  p.block_tables = tables;
  p.max_blocks = width;
  p.context_lens = cl;
  p.query_starts = qs;
  p.num_seqs = nseq;
  p.scale = static_cast<float>(scale);
  paged_attention_cpu(p);
}

}  // namespace
}  // namespace kvserve

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kvserve's CPU kernels: paged attention and the fused pointwise ops";
  m.def("write_kv", &kvserve::write_kv, "Write K/V rows into their cache slots",
        pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("layer_cache"),
        pybind11::arg("slot_mapping"), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("paged_attention", &kvserve::paged_attention, "Varlen paged attention",
        pybind11::arg("out"), pybind11::arg("q"), pybind11::arg("layer_cache"),
        pybind11::arg("block_tables"), pybind11::arg("context_lens"),
        pybind11::arg("query_starts"), pybind11::arg("scale"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("rms_norm", &kvserve::rms_norm, "RMSNorm of each row", pybind11::arg("out"),
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("add_rms_norm", &kvserve::add_rms_norm, "residual += x, then x = RMSNorm(residual)",
        pybind11::arg("x"), pybind11::arg("residual"), pybind11::arg("weight"),
        pybind11::arg("eps"), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("silu_and_mul", &kvserve::silu_and_mul, "silu(gate) * up", pybind11::arg("out"),
        pybind11::arg("x"), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("rotary", &kvserve::rotary, "Rotary embedding of q and k, in place", pybind11::arg("q"),
        pybind11::arg("k"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("vector_width", [] { return kvserve::kW; }, "fp32 lanes per SIMD vector");
}
