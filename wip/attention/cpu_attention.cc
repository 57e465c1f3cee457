// Grouped-query attention of a few queries against a head-major KV cache, for XLA:CPU
// through JAX's FFI (a prototype: specjax/models/llama.py `attention` is the reference).
//
//   specjax_attention: out[B, T, N, H] = softmax(scale * q . k^T, masked) . v
//     q [B, T, N, H] float32, k and v [B, G, S, H] float32 (N = G * R query heads share
//     a KV head), mask [B, T, S] bool (true: the query sees the slot).
//
// One pass over each KV head's keys and one over its values for all T * R queries that
// share it: XLA's batched matmul for one query row re-reads and reshapes the cache, at
// 4-5x its bytes (BENCHMARKS.md, "what a draft step is made of"). Slots no query sees
// are skipped. A query that sees no slot gets the mean of every value, as a softmax of
// equal (-1e30) scores does in XLA.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "specjax/kernels/spin_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX2__) && defined(__FMA__)
// exp of 8 floats <= 0 (softmax terms): 2^n * e^r with r in [-ln2/2, ln2/2], e^r by a
// degree-6 polynomial (relative error ~2e-7 over the range); below -87 it flushes to 0.
inline __m256 Exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

float Dot(const float* a, const float* b, int64_t h) {
  int64_t i = 0;
  float total = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= h; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= h; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  total = Sum8(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < h; ++i) total += a[i] * b[i];
  return total;
}

// out[j] = exp(x[j]) for x <= 0 (the scores less their maximum).
void ExpInPlace(float* x, int64_t n) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, Exp8(_mm256_loadu_ps(x + j)));
#endif
  for (; j < n; ++j) x[j] = std::exp(x[j]);
}

// acc[0:h] += w * v[0:h]
inline void Axpy(float* acc, float w, const float* v, int64_t h) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 ww = _mm256_set1_ps(w);
  for (; i + 8 <= h; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(ww, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
#endif
  for (; i < h; ++i) acc[i] += w * v[i];
}

// One (row b, KV head g): its T * R queries against slots [0, S).
void Head(const float* q, const float* k, const float* v, const bool* mask, float* out,
          int64_t b, int64_t g, int64_t t_dim, int64_t n_dim, int64_t g_dim, int64_t s_dim,
          int64_t h, float scale) {
  const int64_t r_dim = n_dim / g_dim, rows = t_dim * r_dim;
  const float* kh = k + (b * g_dim + g) * s_dim * h;
  const float* vh = v + (b * g_dim + g) * s_dim * h;
  const bool* mb = mask + b * t_dim * s_dim;
  // Slots some query sees, in order: the only ones read.
  std::vector<int32_t> seen;
  seen.reserve(s_dim);
  for (int64_t s = 0; s < s_dim; ++s) {
    bool any = false;
    for (int64_t t = 0; t < t_dim && !any; ++t) any = mb[t * s_dim + s];
    if (any) seen.push_back(static_cast<int32_t>(s));
  }
  const int64_t m = static_cast<int64_t>(seen.size());
  std::vector<float> p(rows * std::max<int64_t>(m, 1));
  std::vector<float> acc(rows * h, 0.f);
  std::vector<float> total(rows, 0.f);
  // Scores: each key read once for every query of this head.
  for (int64_t j = 0; j < m; ++j) {
    const float* key = kh + seen[j] * h;
    for (int64_t t = 0; t < t_dim; ++t) {
      const bool sees = mb[t * s_dim + seen[j]];
      for (int64_t r = 0; r < r_dim; ++r) {
        const int64_t row = t * r_dim + r;
        const float* qr = q + ((b * t_dim + t) * n_dim + g * r_dim + r) * h;
        p[row * m + j] = sees ? scale * Dot(qr, key, h) : -INFINITY;
      }
    }
  }
  for (int64_t row = 0; row < rows; ++row) {
    float* pr = p.data() + row * m;
    float top = -INFINITY;
    for (int64_t j = 0; j < m; ++j) top = std::max(top, pr[j]);
    if (top == -INFINITY) continue;  // sees nothing: handled below
    for (int64_t j = 0; j < m; ++j) pr[j] -= top;  // -inf stays -inf, exp gives 0
    for (int64_t j = 0; j < m; ++j) pr[j] = std::max(pr[j], -100.f);
    ExpInPlace(pr, m);
    for (int64_t j = 0; j < m; ++j)
      if (!mb[(row / r_dim) * s_dim + seen[j]]) pr[j] = 0.f;
    float sum = 0.f;
    for (int64_t j = 0; j < m; ++j) sum += pr[j];
    total[row] = sum;
  }
  // Values: each read once for every query of this head.
  for (int64_t j = 0; j < m; ++j) {
    const float* val = vh + seen[j] * h;
    for (int64_t row = 0; row < rows; ++row) {
      const float w = p[row * m + j];
      if (w != 0.f && total[row] > 0.f) Axpy(acc.data() + row * h, w, val, h);
    }
  }
  for (int64_t t = 0; t < t_dim; ++t) {
    for (int64_t r = 0; r < r_dim; ++r) {
      const int64_t row = t * r_dim + r;
      float* o = out + ((b * t_dim + t) * n_dim + g * r_dim + r) * h;
      if (total[row] > 0.f) {
        const float inv = 1.f / total[row];
        for (int64_t i = 0; i < h; ++i) o[i] = acc[row * h + i] * inv;
      } else {  // no slot seen: XLA's softmax of equal scores, the mean of every value
        std::fill(o, o + h, 0.f);
        for (int64_t s = 0; s < s_dim; ++s) Axpy(o, 1.f / s_dim, vh + s * h, h);
      }
    }
  }
}

ffi::Error Attention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                     ffi::Buffer<ffi::PRED> mask, float scale,
                     ffi::Result<ffi::Buffer<ffi::F32>> out) {
  auto qd = q.dimensions(), kd = k.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || md.size() != 3)
    return ffi::Error::InvalidArgument("specjax attention: bad ranks");
  const int64_t b_dim = qd[0], t_dim = qd[1], n_dim = qd[2], h = qd[3];
  const int64_t g_dim = kd[1], s_dim = kd[2];
  if (kd[0] != b_dim || kd[3] != h || n_dim % g_dim || md[0] != b_dim || md[1] != t_dim ||
      md[2] != s_dim)
    return ffi::Error::InvalidArgument("specjax attention: shapes disagree");
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const bool* mp = mask.typed_data();
  float* op = out->typed_data();
  specjax::SpinPool::Get().Run(b_dim * g_dim, [=](int64_t task) {
    Head(qp, kp, vp, mp, op, task / g_dim, task % g_dim, t_dim, n_dim, g_dim, s_dim, h, scale);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_attention, Attention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());
