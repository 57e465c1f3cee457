// Float32 products of a few rows for XLA:CPU, called through JAX's FFI.
//
//   specjax_linear_nk: y[M, N] = x[M, K] @ w[N, K]^T   (w stored (out, in): a tied
//                                                       embedding used as the head)
//   specjax_linear_kn: y[M, N] = x[M, K] @ w[K, N]     (w stored (in, out): a layer)
//   specjax_argmax:    y[M] = the first index of the maximum of x[M, V] (jnp.argmax's)
//
// A forward of 1-9 new tokens multiplies each weight matrix by a handful of rows: it
// should cost one read of the weights, as a one-token step does. XLA:CPU sends such
// products to a GEMM that repacks the weights on every call (SmolLM2's 113 MB head ran at
// ~28 GB/s where a one-row product ran at ~55 GB/s, experiments/step_profile). These
// kernels read each weight once per call and reuse it from registers or L1 for every
// row of x; the weights are split over spin_pool.h's threads.
//
// One source, compiled once per instruction set (kernels/cpu.py): with AVX-512 the
// 512-bit paths, with AVX2 + FMA the 256-bit paths, and with neither plain C++ (the
// "scalar" build, for exactness tests; cpu.py only dispatches a path that beat XLA's
// own product on this machine). Sums are float32 in a fixed order that does not depend
// on the number of threads: results are deterministic.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "specjax/kernels/simd.h"
#include "specjax/kernels/spin_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxRows = 1 << 20;  // rows of x the kernels accept (dispatch: <= 64)

#if defined(__AVX512F__)
#define SPECJAX_ISA "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define SPECJAX_ISA "avx2"
#else
#define SPECJAX_ISA "scalar"
#endif

// ---- w[N, K] (out, in) --------------------------------------------------------------

#if defined(__AVX2__) && defined(__FMA__)
// A tile reads four weight rows side by side; the first pass over them (m0 == 0) also
// fetches the cache line at the same k of the next four, so the next tile's weights are
// on their way while this one computes. Without it the tiles' FMAs and the weights'
// stream took turns: from 2 rows of x the head (49152 x 576) ran 1.2-1.4x slower on the Xeon
// of BENCHMARKS.md (experiments/cpu_paths/results/nk_prefetch_xeon.txt).
inline void NkPrefetchNext(const float* const wr[4], int64_t k_dim, int64_t k) {
  for (int r = 0; r < 4; ++r)
    _mm_prefetch(reinterpret_cast<const char*>(wr[r] + 4 * k_dim + k), _MM_HINT_T0);
}
#endif

#if defined(__AVX512F__)
// Weight rows [n, n + 4) against rows [m0, m0 + MB) of x.
template <int MB>
inline void NkTile(const float* x, const float* w, float* y, int64_t k_dim, int64_t n_dim,
                   int64_t n, int64_t m0) {
  const float* wr[4] = {w + n * k_dim, w + (n + 1) * k_dim, w + (n + 2) * k_dim,
                        w + (n + 3) * k_dim};
  __m512 acc[MB][4];
  for (int i = 0; i < MB; ++i)
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_setzero_ps();
  const int64_t k_vec = k_dim / 16 * 16;
  const bool fetch = m0 == 0 && n + 8 <= n_dim;
  for (int64_t k = 0; k < k_vec; k += 16) {
    if (fetch) NkPrefetchNext(wr, k_dim, k);
    const __m512 v0 = _mm512_loadu_ps(wr[0] + k), v1 = _mm512_loadu_ps(wr[1] + k);
    const __m512 v2 = _mm512_loadu_ps(wr[2] + k), v3 = _mm512_loadu_ps(wr[3] + k);
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + (m0 + i) * k_dim + k);
      acc[i][0] = _mm512_fmadd_ps(xv, v0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xv, v1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(xv, v2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(xv, v3, acc[i][3]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int r = 0; r < 4; ++r) {
      float total = _mm512_reduce_add_ps(acc[i][r]);
      for (int64_t k = k_vec; k < k_dim; ++k)  // the tail of K past the last full vector
        total = __builtin_fmaf(x[(m0 + i) * k_dim + k], wr[r][k], total);
      y[(m0 + i) * n_dim + n + r] = total;
    }
}
constexpr int64_t kNkLanes = 16;
constexpr int kNkRows = 4;  // rows of x per tile
#elif defined(__AVX2__) && defined(__FMA__)
// Weight rows [n, n + 4) against rows [m0, m0 + MB) of x (8 of the 16 registers
// accumulate, 4 hold weights).
template <int MB>
inline void NkTile(const float* x, const float* w, float* y, int64_t k_dim, int64_t n_dim,
                   int64_t n, int64_t m0) {
  const float* wr[4] = {w + n * k_dim, w + (n + 1) * k_dim, w + (n + 2) * k_dim,
                        w + (n + 3) * k_dim};
  __m256 acc[MB][4];
  for (int i = 0; i < MB; ++i)
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm256_setzero_ps();
  const int64_t k_vec = k_dim / 8 * 8;
  const bool fetch = m0 == 0 && n + 8 <= n_dim;
  for (int64_t k = 0; k < k_vec; k += 8) {
    if (fetch && k % 16 == 0) NkPrefetchNext(wr, k_dim, k);
    const __m256 v0 = _mm256_loadu_ps(wr[0] + k), v1 = _mm256_loadu_ps(wr[1] + k);
    const __m256 v2 = _mm256_loadu_ps(wr[2] + k), v3 = _mm256_loadu_ps(wr[3] + k);
    for (int i = 0; i < MB; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + (m0 + i) * k_dim + k);
      acc[i][0] = _mm256_fmadd_ps(xv, v0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xv, v1, acc[i][1]);
      acc[i][2] = _mm256_fmadd_ps(xv, v2, acc[i][2]);
      acc[i][3] = _mm256_fmadd_ps(xv, v3, acc[i][3]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int r = 0; r < 4; ++r) {
      float total = specjax::Sum8(acc[i][r]);
      for (int64_t k = k_vec; k < k_dim; ++k)  // the tail of K past the last full vector
        total = __builtin_fmaf(x[(m0 + i) * k_dim + k], wr[r][k], total);
      y[(m0 + i) * n_dim + n + r] = total;
    }
}
constexpr int64_t kNkLanes = 8;
constexpr int kNkRows = 2;
#endif

// y[m, lo:hi] = x[m, :] . w[lo:hi, :] for every row m.
void NkChunk(const float* x, const float* w, float* y, int64_t m_rows, int64_t k_dim,
             int64_t n_dim, int64_t lo, int64_t hi) {
  int64_t n = lo;
#if defined(__AVX2__) && defined(__FMA__)
  if (k_dim >= kNkLanes) {
    for (; n + 4 <= hi; n += 4) {
      int64_t m0 = 0;
      for (; m0 + kNkRows <= m_rows; m0 += kNkRows)
        NkTile<kNkRows>(x, w, y, k_dim, n_dim, n, m0);
      switch (m_rows - m0) {  // the rows past the last full tile, in one tile
        case 1: NkTile<1>(x, w, y, k_dim, n_dim, n, m0); break;
#if defined(__AVX512F__)
        case 2: NkTile<2>(x, w, y, k_dim, n_dim, n, m0); break;
        case 3: NkTile<3>(x, w, y, k_dim, n_dim, n, m0); break;
#endif
        default:  // none left (or, were kNkRows ever larger, one row at a time)
          for (; m0 < m_rows; ++m0) NkTile<1>(x, w, y, k_dim, n_dim, n, m0);
      }
    }
  }
#endif
  for (; n < hi; ++n) {
    const float* wn = w + n * k_dim;
    for (int64_t m = 0; m < m_rows; ++m) {
      const float* xm = x + m * k_dim;
      float lane[8] = {};  // eight interleaved sums, as a vector path's lanes
      int64_t k = 0;
      for (; k + 8 <= k_dim; k += 8)
        for (int l = 0; l < 8; ++l) lane[l] = __builtin_fmaf(xm[k + l], wn[k + l], lane[l]);
      float acc = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                  ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      for (; k < k_dim; ++k) acc = __builtin_fmaf(xm[k], wn[k], acc);
      y[m * n_dim + n] = acc;
    }
  }
}

// ---- w[K, N] (in, out) --------------------------------------------------------------
//
// Split over K: part p takes the rows [k0, k1) of w, one contiguous stretch of memory,
// and adds x[m, k] * w[k, :] into its own partial sums y_p[m, :] (L1/L2-resident: N * M
// floats), four rows of w at a time; the parts are then summed in order. Every weight is
// read once, sequentially, as a one-row product's would be (a split over columns walked
// the rows with a stride instead: 33.5 ms a SmolLM2 step, XLA 27). The number of parts
// depends only on K, so the sums' order, and the results, do not depend on the threads.

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec VLoad(const float* p) { return _mm512_loadu_ps(p); }
inline void VStore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec VZero() { return _mm512_setzero_ps(); }
inline Vec VSplat(float v) { return _mm512_set1_ps(v); }
inline Vec VFma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec VAdd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec VLoad(const float* p) { return _mm256_loadu_ps(p); }
inline void VStore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec VZero() { return _mm256_setzero_ps(); }
inline Vec VSplat(float v) { return _mm256_set1_ps(v); }
inline Vec VFma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec VAdd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
#endif

constexpr int64_t kKnPartRows = 64;  // at least this many rows of w per part
constexpr int64_t kKnMaxParts = 8;
// Rows of x from which KnPart keeps its sums in registers (KnPartRows); fewer go the
// one-row way (at 2 rows the two were within 15% of each other, either way, on the Xeon
// of BENCHMARKS.md; from 3 rows the tiles ran 1.2-1.9x faster). SPECJAX_KN_TILE_ROWS sets
// it at build time for experiments.
#ifndef SPECJAX_KN_TILE_ROWS
#define SPECJAX_KN_TILE_ROWS 3
#endif
constexpr int64_t kKnMinTileRows = SPECJAX_KN_TILE_ROWS;

int64_t KnParts(int64_t k_dim) {
  return std::clamp<int64_t>(k_dim / kKnPartRows, 1, kKnMaxParts);
}

#if defined(__AVX2__) && defined(__FMA__)
// Several rows of x: each output stays in a register for the whole part. A tile is up to
// kKnTileRows rows of x by kKnWide vectors of columns; it walks the part's rows of w down
// one column stretch and stores its sums once. The one-row path below loads and stores
// every partial sum once per eight rows of w instead: at 5-9 rows of x those sums outgrow
// L1, and that traffic, not the weights, set its speed (14-19 GB/s against 32-52 for one
// row on the Xeon of BENCHMARKS.md). A stretch is four vectors, 256 (AVX-512) or 128
// (AVX2) bytes of each row of w, whose rows lie a stride apart, so the next stretch is
// prefetched while this one is summed; with two vectors the AVX2 path ran up to 1.6x
// slower at N = 1536-3072. Every sum is the same chain of FMAs over k in order as the
// one-row path's: the results are bitwise the same. The defines are for experiments.
#ifndef SPECJAX_KN_JB
#define SPECJAX_KN_JB 4
#endif
constexpr int kKnWide = SPECJAX_KN_JB;
#if defined(SPECJAX_KN_MB)
constexpr int kKnTileRows = SPECJAX_KN_MB;
#elif defined(__AVX512F__)
constexpr int kKnTileRows = 6;  // 24 accumulators + 4 weights of 32 registers
#else
constexpr int kKnTileRows = 3;  // 12 accumulators + 4 weights of 16 (FMAs take x from memory)
#endif
#if defined(__AVX512F__)
static_assert(kKnTileRows >= 1 && kKnTileRows <= 12, "KnTiles instantiates 1-12 rows");
#else
static_assert(kKnTileRows >= 1 && kKnTileRows <= 6, "KnTiles instantiates 1-6 rows");
#endif

template <int MB, int JB>
inline void KnTile(const float* x, const float* w, float* part, int64_t k_dim, int64_t n_dim,
                   int64_t k0, int64_t k1, int64_t m0, int64_t j, const float* next) {
  Vec acc[MB][JB];
  for (int i = 0; i < MB; ++i)
    for (int b = 0; b < JB; ++b) acc[i][b] = VZero();
  for (int64_t k = k0; k < k1; ++k) {
    const float* wk = w + k * n_dim + j;
    if (next != nullptr)
      for (int b = 0; b < JB * kLanes; b += 16)
        _mm_prefetch(reinterpret_cast<const char*>(next + k * n_dim + b), _MM_HINT_T0);
    Vec v[JB];
    for (int b = 0; b < JB; ++b) v[b] = VLoad(wk + b * kLanes);
    for (int i = 0; i < MB; ++i) {
      const Vec xv = VSplat(x[(m0 + i) * k_dim + k]);
      for (int b = 0; b < JB; ++b) acc[i][b] = VFma(xv, v[b], acc[i][b]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int b = 0; b < JB; ++b) VStore(part + (m0 + i) * n_dim + j + b * kLanes, acc[i][b]);
}

// Rows [m0, m0 + rows) of x, rows <= kKnTileRows, against the columns [j, j + JB * kLanes).
template <int JB>
void KnTiles(const float* x, const float* w, float* part, int64_t k_dim, int64_t n_dim,
             int64_t k0, int64_t k1, int64_t m0, int64_t rows, int64_t j, const float* next) {
  switch (rows) {
#define SPECJAX_KN_TILE(R) \
  case R:                  \
    return KnTile<R, JB>(x, w, part, k_dim, n_dim, k0, k1, m0, j, next);
    SPECJAX_KN_TILE(1)
    SPECJAX_KN_TILE(2)
    SPECJAX_KN_TILE(3)
    SPECJAX_KN_TILE(4)
    SPECJAX_KN_TILE(5)
    SPECJAX_KN_TILE(6)
#if defined(__AVX512F__)
    SPECJAX_KN_TILE(7)
    SPECJAX_KN_TILE(8)
    SPECJAX_KN_TILE(9)
    SPECJAX_KN_TILE(10)
    SPECJAX_KN_TILE(11)
    SPECJAX_KN_TILE(12)
#endif
#undef SPECJAX_KN_TILE
  }
}

// The columns [0, vec_n) of a part, for every row of x.
void KnPartRows(const float* x, const float* w, float* part, int64_t m_rows, int64_t k_dim,
                int64_t n_dim, int64_t k0, int64_t k1, int64_t vec_n) {
  constexpr int64_t kWide = kKnWide * kLanes;
  const int64_t wide_n = vec_n / kWide * kWide;
  for (int64_t j = 0; j < vec_n;) {
    const bool wide = j < wide_n;
    const int64_t step = wide ? kWide : kLanes;
    // Prefetch the next stretch on the first pass over rows of x; later passes find this
    // one in L1 or L2 (its k1 - k0 rows of 128 or 256 bytes).
    const float* next = j + step < vec_n ? w + j + step : nullptr;
    for (int64_t m0 = 0; m0 < m_rows; m0 += kKnTileRows) {
      const int64_t rows = std::min<int64_t>(kKnTileRows, m_rows - m0);
      if (wide)
        KnTiles<kKnWide>(x, w, part, k_dim, n_dim, k0, k1, m0, rows, j, m0 == 0 ? next : nullptr);
      else
        KnTiles<1>(x, w, part, k_dim, n_dim, k0, k1, m0, rows, j, m0 == 0 ? next : nullptr);
    }
    j += step;
  }
}
#endif

// part[m, :] = sum over k in [k0, k1) of x[m, k] * w[k, :].
void KnPart(const float* x, const float* w, float* part, int64_t m_rows, int64_t k_dim,
            int64_t n_dim, int64_t k0, int64_t k1) {
#if defined(__AVX2__) && defined(__FMA__)
  const int64_t vec_n = n_dim / kLanes * kLanes;
  if (m_rows >= kKnMinTileRows && vec_n > 0) {
    KnPartRows(x, w, part, m_rows, k_dim, n_dim, k0, k1, vec_n);
    for (int64_t j = vec_n; j < n_dim; ++j)  // the columns past the last full vector
      for (int64_t m = 0; m < m_rows; ++m) {
        float acc = 0.f;
        for (int64_t k = k0; k < k1; ++k)
          acc = __builtin_fmaf(x[m * k_dim + k], w[k * n_dim + j], acc);
        part[m * n_dim + j] = acc;
      }
    return;
  }
#endif
  std::fill(part, part + m_rows * n_dim, 0.f);
  int64_t k = k0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; k + 8 <= k1; k += 8) {  // eight rows of w per pass over the partial sums
    const float* w0 = w + k * n_dim;
    for (int64_t j = 0; j < vec_n; j += kLanes) {
      Vec v[8];
      for (int r = 0; r < 8; ++r) v[r] = VLoad(w0 + r * n_dim + j);
      for (int64_t m = 0; m < m_rows; ++m) {
        const float* xm = x + m * k_dim + k;
        float* pm = part + m * n_dim + j;
        Vec acc = VLoad(pm);
        for (int r = 0; r < 8; ++r) acc = VFma(VSplat(xm[r]), v[r], acc);
        VStore(pm, acc);
      }
    }
    for (int64_t j = vec_n; j < n_dim; ++j) {
      for (int64_t m = 0; m < m_rows; ++m) {
        const float* xm = x + m * k_dim + k;
        float acc = part[m * n_dim + j];
        for (int r = 0; r < 8; ++r) acc = __builtin_fmaf(xm[r], w0[r * n_dim + j], acc);
        part[m * n_dim + j] = acc;
      }
    }
  }
  for (; k + 4 <= k1; k += 4) {
    const float* w0 = w + k * n_dim;
    const float* w1 = w0 + n_dim;
    const float* w2 = w1 + n_dim;
    const float* w3 = w2 + n_dim;
    for (int64_t j = 0; j < vec_n; j += kLanes) {
      const Vec v0 = VLoad(w0 + j), v1 = VLoad(w1 + j), v2 = VLoad(w2 + j), v3 = VLoad(w3 + j);
      for (int64_t m = 0; m < m_rows; ++m) {
        const float* xm = x + m * k_dim + k;
        float* pm = part + m * n_dim + j;
        Vec acc = VLoad(pm);
        acc = VFma(VSplat(xm[0]), v0, acc);
        acc = VFma(VSplat(xm[1]), v1, acc);
        acc = VFma(VSplat(xm[2]), v2, acc);
        acc = VFma(VSplat(xm[3]), v3, acc);
        VStore(pm, acc);
      }
    }
    for (int64_t j = vec_n; j < n_dim; ++j) {
      for (int64_t m = 0; m < m_rows; ++m) {
        const float* xm = x + m * k_dim + k;
        float acc = part[m * n_dim + j];
        acc = __builtin_fmaf(xm[0], w0[j], acc);
        acc = __builtin_fmaf(xm[1], w1[j], acc);
        acc = __builtin_fmaf(xm[2], w2[j], acc);
        acc = __builtin_fmaf(xm[3], w3[j], acc);
        part[m * n_dim + j] = acc;
      }
    }
  }
#endif
  for (; k < k1; ++k) {
    const float* wk = w + k * n_dim;
    for (int64_t m = 0; m < m_rows; ++m) {
      const float xk = x[m * k_dim + k];
      float* pm = part + m * n_dim;
      for (int64_t j = 0; j < n_dim; ++j) pm[j] = __builtin_fmaf(xk, wk[j], pm[j]);
    }
  }
}

// y[:, lo:hi] = the parts' sums, in part order.
void KnReduce(const float* parts, float* y, int64_t count, int64_t size, int64_t lo,
              int64_t hi) {
  int64_t i = lo;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + kLanes <= hi; i += kLanes) {
    Vec acc = VLoad(parts + i);
    for (int64_t p = 1; p < count; ++p) acc = VAdd(acc, VLoad(parts + p * size + i));
    VStore(y + i, acc);
  }
#endif
  for (; i < hi; ++i) {
    float acc = parts[i];
    for (int64_t p = 1; p < count; ++p) acc += parts[p * size + i];
    y[i] = acc;
  }
}

// x[..., K] and w (2-D): the rows of x, K and N, or an error. `kn`: w is [K, N].
ffi::Error CheckShapes(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w, bool kn,
                       int64_t* m_rows, int64_t* k_dim, int64_t* n_dim) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  if (xd.size() < 1 || wd.size() != 2)
    return ffi::Error::InvalidArgument("specjax linear: x must have rank >= 1 and w rank 2");
  *k_dim = xd.back();
  *m_rows = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) *m_rows *= xd[i];
  *n_dim = kn ? wd[1] : wd[0];
  if ((kn ? wd[0] : wd[1]) != *k_dim)
    return ffi::Error::InvalidArgument("specjax linear: contracting dimensions differ");
  if (*m_rows > kMaxRows)
    return ffi::Error::InvalidArgument("specjax linear: too many rows for the kernel");
  return ffi::Error::Success();
}

// Splits the N outputs into chunks of `align`-multiples, about 8 per thread.
template <typename Body>
void SplitColumns(int64_t n_dim, int64_t align, bool linger, Body body) {
  const int64_t threads = specjax::SpinPool::Get().threads();
  int64_t cols = (n_dim + 8 * threads - 1) / (8 * threads);
  cols = std::max<int64_t>(align, (cols + align - 1) / align * align);
  const int64_t chunks = (n_dim + cols - 1) / cols;
  specjax::SpinPool::Get().Run(chunks, [=](int64_t c) {
    body(c * cols, std::min(n_dim, (c + 1) * cols));
  }, linger);
}

ffi::Error LinearNk(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y) {
  int64_t m_rows, k_dim, n_dim;
  if (auto e = CheckShapes(x, w, false, &m_rows, &k_dim, &n_dim); e.failure()) return e;
  const float* xp = x.typed_data<float>();
  const float* wp = w.typed_data<float>();
  float* yp = y->typed_data<float>();
  SplitColumns(n_dim, 16, /*linger=*/n_dim * k_dim < (1 << 22), [=](int64_t lo, int64_t hi) {
    NkChunk(xp, wp, yp, m_rows, k_dim, n_dim, lo, hi);
  });
  return ffi::Error::Success();
}

ffi::Error LinearKn(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y) {
  int64_t m_rows, k_dim, n_dim;
  if (auto e = CheckShapes(x, w, true, &m_rows, &k_dim, &n_dim); e.failure()) return e;
  const float* xp = x.typed_data<float>();
  const float* wp = w.typed_data<float>();
  float* yp = y->typed_data<float>();
  const int64_t parts = KnParts(k_dim), size = m_rows * n_dim;
  const int64_t span = (k_dim + parts - 1) / parts;
  if (parts == 1) {
    KnPart(xp, wp, yp, m_rows, k_dim, n_dim, 0, k_dim);
    return ffi::Error::Success();
  }
  std::unique_ptr<float[]> sums(new float[parts * size]);
  float* sp = sums.get();
  auto& pool = specjax::SpinPool::Get();
  pool.Run(parts, [=](int64_t p) {
    KnPart(xp, wp, sp + p * size, m_rows, k_dim, n_dim, p * span,
           std::min(k_dim, (p + 1) * span));
  });
  const int64_t slices = std::min<int64_t>(pool.threads(), (size + 255) / 256);
  const int64_t per = ((size + slices - 1) / slices + 15) / 16 * 16;
  pool.Run(slices, [=](int64_t c) {
    KnReduce(sp, yp, parts, size, c * per, std::min(size, (c + 1) * per));
  });
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
#if defined(__AVX2__) && defined(__FMA__)
    Vec a0 = VZero(), a1 = VZero(), a2 = VZero(), a3 = VZero();
    for (; i + 4 * kLanes <= hi; i += 4 * kLanes) {
      for (int p = 0; p < 4 * kLanes; p += 16)
        _mm_prefetch(reinterpret_cast<const char*>(xp + i + 1024 + p), _MM_HINT_T0);
      a0 = VFma(VSplat(1.f), VLoad(xp + i), a0);
      a1 = VFma(VSplat(1.f), VLoad(xp + i + kLanes), a1);
      a2 = VFma(VSplat(1.f), VLoad(xp + i + 2 * kLanes), a2);
      a3 = VFma(VSplat(1.f), VLoad(xp + i + 3 * kLanes), a3);
    }
    alignas(64) float lanes[kLanes];
    VStore(lanes, VFma(VSplat(1.f), a0, VFma(VSplat(1.f), a1, VFma(VSplat(1.f), a2, a3))));
    for (int l = 0; l < kLanes; ++l) total += lanes[l];
#endif
    for (; i < hi; ++i) total += xp[i];
    pp[c] = total;
  }, /*linger=*/false);
  float total = 0.f;
  for (int64_t c = 0; c < chunks; ++c) total += pp[c];
  y->typed_data<float>()[0] = total;
  return ffi::Error::Success();
}


// ---- argmax -------------------------------------------------------------------------
//
// The first index of each row's largest value, or of its first NaN where it holds one (as
// jnp.argmax and specjax/core/sampling.py `argmax` on XLA). XLA:CPU ran sampling's
// maximum and minimum as scalar loops, ~0.1 ms over SmolLM2's 49152 logits at every draft
// step and verification (experiments/cpu_paths/iteration_profile.py); here a row is read
// twice at vector width, on the calling thread (a row just left by the head sits in L2).
int32_t ArgmaxRow(const float* x, int64_t n) {
  float top = -INFINITY;
  bool nan = false;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  __mmask16 unordered = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    unordered |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);  // a or b is NaN
    m0 = _mm512_max_ps(m0, a);
    m1 = _mm512_max_ps(m1, b);
  }
  nan = unordered != 0;
  top = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, unordered = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
  }
  nan = _mm256_movemask_ps(unordered) != 0;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  for (float v : lanes) top = std::max(top, v);
#endif
  for (; i < n; ++i) {
    nan |= std::isnan(x[i]);
    top = std::max(top, x[i]);
  }
  if (nan) {
    for (int64_t j = 0; j < n; ++j)
      if (std::isnan(x[j])) return static_cast<int32_t>(j);
  }
  i = 0;
#if defined(__AVX512F__)
  const __m512 t = _mm512_set1_ps(top);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), t, _CMP_EQ_OQ);
    if (eq) return static_cast<int32_t>(i + __builtin_ctz(eq));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 t = _mm256_set1_ps(top);
  for (; i + 8 <= n; i += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_EQ_OQ));
    if (eq) return static_cast<int32_t>(i + __builtin_ctz(eq));
  }
#endif
  for (; i < n; ++i)
    if (x[i] == top) return static_cast<int32_t>(i);
  return 0;  // not reached: a row without NaN holds its maximum
}

ffi::Error Argmax(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  auto xd = x.dimensions();
  if (xd.size() < 1 || xd.back() < 1 || x.element_type() != ffi::DataType::F32 ||
      y->element_type() != ffi::DataType::S32 || y->element_count() * xd.back() != x.element_count())
    return ffi::Error::InvalidArgument("specjax argmax: x must be float32 [..., V >= 1], y int32 [...]");
  const int64_t n = xd.back(), rows = x.element_count() / n;
  const float* xp = x.typed_data<float>();
  int32_t* yp = y->typed_data<int32_t>();
  for (int64_t r = 0; r < rows; ++r) yp[r] = ArgmaxRow(xp + r * n, n);
  return ffi::Error::Success();
}

}  // namespace

// The instruction set this library was compiled for (cpu.py checks it after loading).
extern "C" const char* specjax_isa() { return SPECJAX_ISA; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_stream_sum, StreamSum,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_linear_nk, LinearNk,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_linear_kn, LinearKn,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_argmax, Argmax,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
