// The decoder's fused pointwise ops (pointwise.cpp); ops.cpp binds them. Every tensor is
// float32 on the CPU, contiguous in its last dimension; shapes and dtypes are checked.
#pragma once

#include <torch/extension.h>

namespace kvserve {

// out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), for x, out [rows, n].
void rms_norm(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps);

// In place: residual += x, then x = rms_norm(residual) (both [rows, n]).
void add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                  double eps);

// out = silu(x[:, :n]) * x[:, n:], for x [rows, 2n], out [rows, n].
void silu_and_mul(const at::Tensor& out, const at::Tensor& x);

// In place, rotate_half style: q [T, Hq, D] and k [T, Hkv, D] by cos, sin [T, D].
void rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
            const at::Tensor& sin);

}  // namespace kvserve
