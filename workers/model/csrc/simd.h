// Portable SIMD helpers for the paged-attention kernel (GCC/Clang vector extensions).
//
// The vector width is fixed at build time from the target (-march=native): 16 floats with
// AVX-512, 8 with AVX/AVX2, else 4 (SSE, NEON). Everything computes in fp32; bf16 and fp16
// are widened on load.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's AVX-512 intrinsics warn falsely about _mm512_undefined_* (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kvserve {

// KVSERVE_SIMD_WIDTH (4, 8 or 16) overrides the choice, for testing another width's code
// on this machine (the compiler splits wider vectors).
#if defined(KVSERVE_SIMD_WIDTH)
#define KVSERVE_W KVSERVE_SIMD_WIDTH
#elif defined(__AVX512F__)
#define KVSERVE_W 16
#elif defined(__AVX__)
#define KVSERVE_W 8
#else
#define KVSERVE_W 4
#endif
#if KVSERVE_W != 4 && KVSERVE_W != 8 && KVSERVE_W != 16
#error "KVSERVE_SIMD_WIDTH must be 4, 8 or 16"
#endif
constexpr int kW = KVSERVE_W;

typedef float vf __attribute__((vector_size(kW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kW * sizeof(int32_t))));
typedef uint16_t vh __attribute__((vector_size(kW * sizeof(uint16_t))));
typedef uint32_t vu __attribute__((vector_size(kW * sizeof(uint32_t))));
typedef float vf4 __attribute__((vector_size(4 * sizeof(float))));

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline vf vsplat(float x) {
  const vf v = {x};
#if KVSERVE_W == 16
  return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
#elif KVSERVE_W == 8
  return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0);
#else
  return __builtin_shufflevector(v, v, 0, 0, 0, 0);
#endif
}

inline vf vload(const float* p) {
  vf r;
  std::memcpy(&r, p, sizeof r);
  return r;
}

inline vf vload(const c10::BFloat16* p) {
  // bf16 is the top half of an fp32: widen and shift.
#if defined(__AVX512F__) && KVSERVE_W == 16
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif defined(__AVX2__) && KVSERVE_W == 8
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (vf)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
  vh h;
  std::memcpy(&h, p, sizeof h);
  vu w = __builtin_convertvector(h, vu) << 16;
  vf r;
  std::memcpy(&r, &w, sizeof r);
  return r;
#endif
}

inline vf vload(const c10::Half* p) {
#if defined(__F16C__) && defined(__AVX512F__) && KVSERVE_W == 16
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__) && KVSERVE_W == 8
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  vf r;
  for (int i = 0; i < kW; ++i) r[i] = static_cast<float>(p[i]);
  return r;
#endif
}

// Returns v, kept in a register: stops the compiler from re-loading it from memory as an
// operand of every FMA that uses it (load-port bound otherwise).
inline vf vpinned(vf v) {
#if defined(KVSERVE_SIMD_WIDTH)
  // the vector may not fit a register
#elif defined(__AVX512F__)
  asm("" : "+v"(v));
#elif defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(v));
#elif defined(__aarch64__)
  asm("" : "+w"(v));
#endif
  return v;
}

inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

inline vf vmax(vf a, vf b) { return a > b ? a : b; }

// Sum of the lanes.
inline float hsum(vf v) {
#if KVSERVE_W == 16
  typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));
  vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
#elif KVSERVE_W == 8
  vf4 b = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
#else
  vf4 b = v;
#endif
  vf4 c = b + __builtin_shufflevector(b, b, 2, 3, 0, 1);
  return c[0] + c[1];
}

// Pairwise sums inside each 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3] per lane.
inline vf hadd_lanes(vf a, vf b) {
#if KVSERVE_W == 16
  return __builtin_shufflevector(a, b, 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30) +
         __builtin_shufflevector(a, b, 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31);
#elif KVSERVE_W == 8
  return __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) +
         __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
#else
  return __builtin_shufflevector(a, b, 0, 2, 4, 6) + __builtin_shufflevector(a, b, 1, 3, 5, 7);
#endif
}

// Lane i of the result is the sum of the lanes of x[i] (a transpose-and-add: about three
// operations per sum instead of hsum's log2(kW) shuffle-adds each).
inline vf reduce_lanes(const vf* x) {
  vf u[kW / 4];
  for (int j = 0; j < kW / 4; ++j) {
    u[j] = hadd_lanes(hadd_lanes(x[4 * j], x[4 * j + 1]), hadd_lanes(x[4 * j + 2], x[4 * j + 3]));
  }
  // u[j], 128-bit lane k: x[4j..4j+3] summed over their lane k; now add across lanes.
#if KVSERVE_W == 16
  vf a = __builtin_shufflevector(u[0], u[1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                 26, 27) +
         __builtin_shufflevector(u[0], u[1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29,
                                 30, 31);
  vf b = __builtin_shufflevector(u[2], u[3], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                 26, 27) +
         __builtin_shufflevector(u[2], u[3], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29,
                                 30, 31);
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                                 27) +
         __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                 31);
#elif KVSERVE_W == 8
  return __builtin_shufflevector(u[0], u[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(u[0], u[1], 4, 5, 6, 7, 12, 13, 14, 15);
#else
  return u[0];
#endif
}

inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < kW; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// exp(x) in fp32 (Cephes' polynomial, about 2 ulp); exactly 0 below -87.3 (and for -inf).
inline vf vexp(vf x) {
  const vf lo = vsplat(-87.3f);
  const vf hi = vsplat(88.0f);
  vi under = x < lo;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  const vf magic = vsplat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf t = x * 1.44269504088896341f + magic;
  vf n = t - magic;
  vf r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = vsplat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  vf y = p * r * r + r + 1.0f;
  vi ti;
  std::memcpy(&ti, &t, sizeof ti);
  vi yi;
  std::memcpy(&yi, &y, sizeof yi);
  yi += (ti - 0x4B400000) << 23;  // 0x4B400000: the bits of `magic`
  vf res;
  std::memcpy(&res, &yi, sizeof res);
  return under ? vf{} : res;
}

}  // namespace kvserve
