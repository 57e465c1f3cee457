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
// across XLA's intra-op thread pool.
//
// Work is cut into chunks claimed from an atomic counter. The calling thread claims
// chunks too and only ever waits for chunks a helper has already claimed (and is
// therefore running), so the call cannot deadlock when every pool thread is busy:
// a helper that starts late finds nothing left and returns.
//
// Sums are float32 in a fixed order that does not depend on the number of threads
// or on which thread ran a chunk: results are deterministic.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define SPECJAX_PAUSE() _mm_pause()
#else
#define SPECJAX_PAUSE() ((void)0)
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxRows = 64;  // rows of x the kernel accepts (Python uses 2-4)

struct Work {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t chunks = 0;
};

// Runs body(chunk) for chunk in [0, chunks) on the caller and up to helpers pool threads.
template <typename Body>
void Parallel(ffi::ThreadPool& pool, int64_t chunks, int64_t helpers, Body body) {
  if (chunks <= 1 || helpers <= 0) {
    for (int64_t c = 0; c < chunks; ++c) body(c);
    return;
  }
  auto work = std::make_shared<Work>();
  work->chunks = chunks;
  // The body is copied into every helper: a helper may start after this call returned,
  // when it finds no chunk left and touches nothing but its own copy and `work`.
  auto drain = [](Work& w, const Body& b) {
    for (;;) {
      int64_t c = w.next.fetch_add(1, std::memory_order_relaxed);
      if (c >= w.chunks) return;
      b(c);
      w.done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t h = 0; h < std::min(helpers, chunks - 1); ++h) {
    pool.Schedule([work, body, drain]() { drain(*work, body); });
  }
  drain(*work, body);
  while (work->done.load(std::memory_order_acquire) < chunks) SPECJAX_PAUSE();
}

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

ffi::Error CheckShapes(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w, int64_t* m_rows,
                       int64_t* k_dim, int64_t* n_dim, bool nk) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  if (xd.size() < 1 || wd.size() != 2)
    return ffi::Error::InvalidArgument("specjax linear: x must have rank >= 1 and w rank 2");
  *k_dim = xd.back();
  *m_rows = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) *m_rows *= xd[i];
  *n_dim = nk ? wd[0] : wd[1];
  if ((nk ? wd[1] : wd[0]) != *k_dim)
    return ffi::Error::InvalidArgument("specjax linear: contracting dimensions differ");
  if (*m_rows > kMaxRows)
    return ffi::Error::InvalidArgument("specjax linear: too many rows for the kernel");
  return ffi::Error::Success();
}

int64_t Helpers(ffi::ThreadPool& pool) { return std::max<int64_t>(pool.num_threads() - 1, 0); }

ffi::Error LinearNk(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w,
                    ffi::Result<ffi::AnyBuffer> y) {
  int64_t m_rows, k_dim, n_dim;
  if (auto e = CheckShapes(x, w, &m_rows, &k_dim, &n_dim, true); e.failure()) return e;
  const float* xp = x.typed_data<float>();
  const float* wp = w.typed_data<float>();
  float* yp = y->typed_data<float>();
  const int64_t helpers = Helpers(pool);
  int64_t rows = (n_dim + 8 * (helpers + 1) - 1) / (8 * (helpers + 1));
  rows = std::max<int64_t>(16, (rows + 3) / 4 * 4);
  const int64_t chunks = (n_dim + rows - 1) / rows;
  Parallel(pool, chunks, helpers, [=](int64_t c) {
    NkChunk(xp, wp, yp, m_rows, k_dim, n_dim, c * rows, std::min(n_dim, (c + 1) * rows));
  });
  return ffi::Error::Success();
}


}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_linear_nk, LinearNk,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

