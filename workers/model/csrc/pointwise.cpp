// The decoder's pointwise ops, fused: RMSNorm (with the residual add before it), SiLU-and-mul
// and rotary embedding. fp32 rows, any row stride, contiguous last dimension; rows are split
// over torch's threads. Each one reads and writes its tensors once, where the torch
// composition they replace makes several passes and temporaries.
#include "pointwise.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "simd.h"

namespace kvserve {
namespace {

void check_rows(const at::Tensor& x, const char* name, int64_t dim = 2) {
  TORCH_CHECK(x.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat, name, " must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == dim, name, " must have ", dim, " dimensions, got ", x.sizes());
  TORCH_CHECK(x.stride(dim - 1) == 1, name, " must be contiguous in its last dimension");
}

void check_weight(const at::Tensor& w, int64_t n) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 1 &&
                  w.size(0) == n && w.is_contiguous(),
              "weight must be a contiguous float32 [", n, "], got ", w.sizes(), " ",
              w.scalar_type());
}

constexpr int64_t kGrainBytes = 1 << 16;  // rows per task: about this many bytes

int64_t grain(int64_t width) { return std::max<int64_t>(1, kGrainBytes / (4 * width)); }

// 1 / sqrt(mean(x^2) + eps) of one row.
float inv_rms(const float* x, int64_t n, float eps) {
  vf a0 = {}, a1 = {};
  int64_t i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    const vf u = vload(x + i), v = vload(x + i + kW);
    a0 += u * u;
    a1 += v * v;
  }
  for (; i + kW <= n; i += kW) {
    const vf u = vload(x + i);
    a0 += u * u;
  }
  float ss = hsum(a0 + a1);
  for (; i < n; ++i) ss += x[i] * x[i];
  return 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
}

// dst = w * (x * r), as transformers' LlamaRMSNorm orders it; dst may be x.
void scale_row(float* dst, const float* x, const float* w, int64_t n, float r) {
  const vf rv = vsplat(r);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vstore(dst + i, vload(w + i) * (vload(x + i) * rv));
  for (; i < n; ++i) dst[i] = w[i] * (x[i] * r);
}

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

// x[:half] and x[half:] rotated by (cos, sin): x1 cos - x2 sin, x2 cos + x1 sin.
void rotate_row(float* x, const float* c, const float* s, int64_t half) {
  int64_t i = 0;
  for (; i + kW <= half; i += kW) {
    const vf x1 = vload(x + i), x2 = vload(x + half + i);
    vstore(x + i, x1 * vload(c + i) - x2 * vload(s + i));
    vstore(x + half + i, x2 * vload(c + half + i) + x1 * vload(s + half + i));
  }
  for (; i < half; ++i) {
    const float x1 = x[i], x2 = x[half + i];
    x[i] = x1 * c[i] - x2 * s[i];
    x[half + i] = x2 * c[half + i] + x1 * s[half + i];
  }
}

void rotate_heads(const at::Tensor& x, const float* cos, const float* sin, int64_t t0,
                  int64_t t1) {
  const int64_t heads = x.size(1), d = x.size(2);
  float* base = x.data_ptr<float>();
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t h = 0; h < heads; ++h)
      rotate_row(base + t * x.stride(0) + h * x.stride(1), cos + t * d, sin + t * d, d / 2);
}

}  // namespace

void rms_norm(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_rows(out, "out");
  TORCH_CHECK(out.sizes() == x.sizes(), "out must be shaped like x ", x.sizes(), ", got ",
              out.sizes());
  const int64_t rows = x.size(0), n = x.size(1);
  check_weight(weight, n);
  const float* w = weight.data_ptr<float>();
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t sx = x.stride(0), so = out.stride(0);
  at::parallel_for(0, rows, grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* row = src + r * sx;
      scale_row(dst + r * so, row, w, n, inv_rms(row, n, static_cast<float>(eps)));
    }
  });
}

void add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                  double eps) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes(), "residual must be shaped like x ", x.sizes(),
              ", got ", residual.sizes());
  const int64_t rows = x.size(0), n = x.size(1);
  check_weight(weight, n);
  const float* w = weight.data_ptr<float>();
  float* xs = x.data_ptr<float>();
  float* rs = residual.data_ptr<float>();
  const int64_t sx = x.stride(0), sr = residual.stride(0);
  at::parallel_for(0, rows, grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* xr = xs + r * sx;
      float* rr = rs + r * sr;
      int64_t i = 0;
      for (; i + kW <= n; i += kW) vstore(rr + i, vload(rr + i) + vload(xr + i));
      for (; i < n; ++i) rr[i] += xr[i];
      scale_row(xr, rr, w, n, inv_rms(rr, n, static_cast<float>(eps)));
    }
  });
}

void silu_and_mul(const at::Tensor& out, const at::Tensor& x) {
  check_rows(x, "x");
  check_rows(out, "out");
  const int64_t rows = x.size(0), n = out.size(1);
  TORCH_CHECK(x.size(1) == 2 * n && out.size(0) == rows, "x must be [rows, 2 * width] for out ",
              out.sizes(), ", got ", x.sizes());
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t sx = x.stride(0), so = out.stride(0);
  const vf one = vsplat(1.0f);
  at::parallel_for(0, rows, grain(2 * n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = src + r * sx;
      const float* u = g + n;
      float* y = dst + r * so;
      int64_t i = 0;
      for (; i + kW <= n; i += kW) {
        const vf gv = vload(g + i);
        vstore(y + i, gv / (one + vexp(-gv)) * vload(u + i));
      }
      for (; i < n; ++i) y[i] = silu(g[i]) * u[i];
    }
  });
}

void rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
            const at::Tensor& sin) {
  check_rows(q, "q", 3);
  check_rows(k, "k", 3);
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  const int64_t tokens = q.size(0), d = q.size(2);
  TORCH_CHECK(d % 2 == 0, "head_dim must be even, got ", d);
  TORCH_CHECK(k.size(0) == tokens && k.size(2) == d, "k must be [", tokens, ", kv_heads, ", d,
              "], got ", k.sizes());
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->size(0) == tokens && t->size(1) == d && t->is_contiguous(),
                "cos and sin must be contiguous [", tokens, ", ", d, "], got ", t->sizes());
  }
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  at::parallel_for(0, tokens, grain((q.size(1) + k.size(1)) * d), [&](int64_t b, int64_t e) {
    rotate_heads(q, c, s, b, e);
    rotate_heads(k, c, s, b, e);
  });
}

}  // namespace kvserve
