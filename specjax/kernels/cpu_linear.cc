// The output head of a verification forward, for XLA:CPU, called through JAX's FFI.
//
//   specjax_linear_nk: y[M, N] = x[M, K] @ w[N, K]^T    (w stored (out, in): a tied
//                                                        embedding used as the head)
//
// A forward of 2-4 new tokens multiplies each weight matrix by a handful of rows: it
// should cost one read of the weights, as a one-token step does. XLA:CPU sends such
// products to a GEMM kernel that repacks the weights on every call; for SmolLM2's
// 113 MB head (49152 x 576) that read ran at ~28 GB/s where a one-row product runs at
// ~55 GB/s (experiments/step_profile). This kernel reads each weight row once per call
// and reuses it, from L1, for up to four rows of x at a time; the rows of w are split
// over spin_pool.h's threads.
//
// Sums are float32 in a fixed order that does not depend on the number of threads
// or on which thread ran a chunk: results are deterministic.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "specjax/kernels/spin_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxRows = 64;  // rows of x the kernel accepts (Python uses 2-4)


// y[m, lo:hi] = x[m, :] . w[lo:hi, :] for every row m: four weight rows at a time,
// each block reused (in L1) for every group of up to four rows of x.
void NkChunk(const float* x, const float* w, float* y, int64_t m_rows, int64_t k_dim,
             int64_t n_dim, int64_t lo, int64_t hi) {
  int64_t n = lo;
#if defined(__AVX512F__)
  if (k_dim % 16 == 0) {
    for (; n + 4 <= hi; n += 4) {
      const float* wr[4] = {w + n * k_dim, w + (n + 1) * k_dim, w + (n + 2) * k_dim,
                            w + (n + 3) * k_dim};
      for (int64_t m0 = 0; m0 < m_rows; m0 += 4) {
        const int64_t mb = std::min<int64_t>(4, m_rows - m0);
        __m512 acc[4][4];
        for (int i = 0; i < 4; ++i)
          for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_setzero_ps();
        for (int64_t k = 0; k < k_dim; k += 16) {
          const __m512 v0 = _mm512_loadu_ps(wr[0] + k), v1 = _mm512_loadu_ps(wr[1] + k);
          const __m512 v2 = _mm512_loadu_ps(wr[2] + k), v3 = _mm512_loadu_ps(wr[3] + k);
          for (int i = 0; i < mb; ++i) {
            const __m512 xv = _mm512_loadu_ps(x + (m0 + i) * k_dim + k);
            acc[i][0] = _mm512_fmadd_ps(xv, v0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(xv, v1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(xv, v2, acc[i][2]);
            acc[i][3] = _mm512_fmadd_ps(xv, v3, acc[i][3]);
          }
        }
        for (int i = 0; i < mb; ++i)
          for (int r = 0; r < 4; ++r) y[(m0 + i) * n_dim + n + r] = _mm512_reduce_add_ps(acc[i][r]);
      }
    }
  }
#endif
  for (; n < hi; ++n) {
    const float* wn = w + n * k_dim;
    for (int64_t m = 0; m < m_rows; ++m) {
      const float* xm = x + m * k_dim;
      float acc = 0.f;
      for (int64_t k = 0; k < k_dim; ++k) acc = __builtin_fmaf(xm[k], wn[k], acc);
      y[m * n_dim + n] = acc;
    }
  }
}

// x[..., K] and w[N, K]: the rows of x, K and N, or an error.
ffi::Error CheckShapes(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w, int64_t* m_rows,
                       int64_t* k_dim, int64_t* n_dim) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  if (xd.size() < 1 || wd.size() != 2)
    return ffi::Error::InvalidArgument("specjax linear: x must have rank >= 1 and w rank 2");
  *k_dim = xd.back();
  *m_rows = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) *m_rows *= xd[i];
  *n_dim = wd[0];
  if (wd[1] != *k_dim)
    return ffi::Error::InvalidArgument("specjax linear: contracting dimensions differ");
  if (*m_rows > kMaxRows)
    return ffi::Error::InvalidArgument("specjax linear: too many rows for the kernel");
  return ffi::Error::Success();
}

ffi::Error LinearNk(ffi::AnyBuffer x, ffi::AnyBuffer w,
                    ffi::Result<ffi::AnyBuffer> y) {
  int64_t m_rows, k_dim, n_dim;
  if (auto e = CheckShapes(x, w, &m_rows, &k_dim, &n_dim); e.failure()) return e;
  const float* xp = x.typed_data<float>();
  const float* wp = w.typed_data<float>();
  float* yp = y->typed_data<float>();
  const int64_t helpers = specjax::SpinPool::Get().threads() - 1;
  int64_t rows = (n_dim + 8 * (helpers + 1) - 1) / (8 * (helpers + 1));
  rows = std::max<int64_t>(16, (rows + 3) / 4 * 4);
  const int64_t chunks = (n_dim + rows - 1) / rows;
  specjax::SpinPool::Get().Run(chunks, [=](int64_t c) {
    NkChunk(xp, wp, yp, m_rows, k_dim, n_dim, c * rows, std::min(n_dim, (c + 1) * rows));
  }, /*linger=*/false);
  return ffi::Error::Success();
}


// The memory roofline probe: the sum of x[N] in float32, read once by every thread of the
// pool in 64 KiB chunks (with prefetch, as the product kernels read weights). y[0] = sum.
ffi::Error StreamSum(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  const int64_t n = x.element_count();
  const float* xp = x.typed_data<float>();
  constexpr int64_t kChunk = 16384;  // floats: 64 KiB
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::unique_ptr<float[]> partial(new float[chunks]);
  float* pp = partial.get();
  specjax::SpinPool::Get().Run(chunks, [=](int64_t c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    int64_t i = lo;
    float total = 0.f;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (; i + 64 <= hi; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(xp + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(xp + i + 1040), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(xp + i + 1056), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(xp + i + 1072), _MM_HINT_T0);
      a0 = _mm512_add_ps(a0, _mm512_loadu_ps(xp + i));
      a1 = _mm512_add_ps(a1, _mm512_loadu_ps(xp + i + 16));
      a2 = _mm512_add_ps(a2, _mm512_loadu_ps(xp + i + 32));
      a3 = _mm512_add_ps(a3, _mm512_loadu_ps(xp + i + 48));
    }
    total = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#endif
    for (; i < hi; ++i) total += xp[i];
    pp[c] = total;
  }, /*linger=*/false);
  float total = 0.f;
  for (int64_t c = 0; c < chunks; ++c) total += pp[c];
  y->typed_data<float>()[0] = total;
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_stream_sum, StreamSum,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_linear_nk, LinearNk,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

