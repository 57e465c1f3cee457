// Grouped-query attention of a few queries against a head-major KV cache, for XLA:CPU
// through JAX's FFI (specjax/models/llama.py `attention` is the reference it must equal).
//
//   specjax_attention: out[B, T, N, H] = softmax(scale * q . k^T, masked) . v
//     q [B, T, N, H] float32, k and v [B, G, S, H] float32 (N = G * R query heads share
//     a KV head), mask [B, T, S] bool (true: the query sees the slot).
//
// A decode step or a verification has 1-9 queries per row: XLA's batched matmul for so few
// rows re-reads and reshapes the cache, at 4-5x its bytes, and attention was about a third
// of the quantized draft's step at 512 slots (BENCHMARKS.md, issue 27). Here each key and
// each value is read once for all T * R queries that share its KV head. The slots are split
// into spans, one task per (row, KV head, span), so that two threads share one row's three
// KV heads evenly; each span keeps its own maximum, sum and weighted values, merged at the
// end as split softmaxes are (the maximum shifts each span's terms by exp(m_span - m)).
// Slots no query sees are skipped. A query that sees no slot gets the mean of every value,
// as XLA's softmax of equal (-1e30) scores gives. A NaN in a query, or in a key or value
// it sees, makes its attention NaN, as in XLA (which also spreads a NaN in a slot no query
// sees, through its zero weight: here such a slot is never read); so does a score that
// overflowed to +-inf (XLA gives NaN for +inf, the unseen slots' mean for all -inf).
//
// The arithmetic of one query does not depend on the other queries or on T (the spans
// depend only on B, G, S and the thread count): a one-row step and a five-row verification
// give bitwise-equal attention for the same query and cache.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "specjax/kernels/simd.h"
#include "specjax/kernels/spin_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMinSpan = 64;  // slots per task at least: fewer cost more to merge

// scores[j] = q . keys[j] for j < m (keys[j] = k + slots[j] * h).
void Scores(const float* q, const float* k, const int32_t* slots, int64_t m, int64_t h,
            float* scores) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (h % 8 == 0) {
    for (; j + 8 <= m; j += 8) {  // eight keys at a time: one transposed sum, not eight
      __m256 acc[8];
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
      for (int64_t i = 0; i < h; i += 8) {
        const __m256 qi = _mm256_loadu_ps(q + i);
        for (int u = 0; u < 8; ++u)
          acc[u] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k + slots[j + u] * h + i), acc[u]);
      }
      _mm256_storeu_ps(scores + j, specjax::Sum8x8(acc));
    }
    for (; j < m; ++j) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t i = 0; i < h; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + slots[j] * h + i), acc);
      scores[j] = specjax::Sum8(acc);
    }
  }
#endif
  for (; j < m; ++j) {
    const float* key = k + slots[j] * h;
    float total = 0.f;
    for (int64_t i = 0; i < h; ++i) total += q[i] * key[i];
    scores[j] = total;
  }
}

// x[j] = exp(x[j]) for x <= 0 (the scores less their maximum); below -87 it is 0 on every
// path (Exp8 flushes there), so the builds agree.
void ExpInPlace(float* x, int64_t n) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, specjax::Exp8(_mm256_loadu_ps(x + j)));
#endif
  for (; j < n; ++j) x[j] = x[j] < -87.f ? 0.f : std::exp(x[j]);
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

struct Shape {
  int64_t t, n, g, s, h, r, spans, span;
  float scale;
};

// One task: (row b, KV head g, slots [s0, s1)) for the T * R queries of that head. Writes
// per query its span maximum, sum and unnormalised weighted values to part[q] =
// [max, sum, acc[0:h]] (max = -inf where the query sees none of these slots).
void Span(const float* q, const float* k, const float* v, const bool* mask, float* part,
          int64_t b, int64_t g, int64_t s0, int64_t s1, const Shape& d) {
  const int64_t width = d.h + 2;
  const float* kh = k + (b * d.g + g) * d.s * d.h;
  const float* vh = v + (b * d.g + g) * d.s * d.h;
  const bool* mb = mask + b * d.t * d.s;
  std::vector<int32_t> slots;
  std::vector<float> scores;
  slots.reserve(s1 - s0);
  scores.resize(s1 - s0 + 8);
  for (int64_t t = 0; t < d.t; ++t) {
    slots.clear();  // the slots query t sees (the same for its R heads)
    for (int64_t s = s0; s < s1; ++s)
      if (mb[t * d.s + s]) slots.push_back(static_cast<int32_t>(s));
    const int64_t m = static_cast<int64_t>(slots.size());
    for (int64_t r = 0; r < d.r; ++r) {
      float* out = part + (t * d.r + r) * width;
      float* acc = out + 2;
      std::fill(acc, acc + d.h, 0.f);
      if (m == 0) {
        out[0] = -INFINITY;
        out[1] = 0.f;
        continue;
      }
      const float* qr = q + ((b * d.t + t) * d.n + g * d.r + r) * d.h;
      Scores(qr, kh, slots.data(), m, d.h, scores.data());
      float top = -INFINITY;
      bool nan = false;
      for (int64_t j = 0; j < m; ++j) {
        top = std::max(top, scores[j] *= d.scale);
        nan |= std::isnan(scores[j]);
      }
      if (nan || !std::isfinite(top)) {  // NaN, or an overflowed score: NaN, as in XLA
        out[0] = 0.f;
        out[1] = NAN;
        std::fill(acc, acc + d.h, NAN);
        continue;
      }
      for (int64_t j = 0; j < m; ++j) scores[j] -= top;
      ExpInPlace(scores.data(), m);
      float sum = 0.f;
      for (int64_t j = 0; j < m; ++j) {
        sum += scores[j];
        Axpy(acc, scores[j], vh + slots[j] * d.h, d.h);
      }
      out[0] = top;
      out[1] = sum;
    }
  }
}

ffi::Error Attention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                     ffi::Buffer<ffi::PRED> mask, float scale,
                     ffi::Result<ffi::Buffer<ffi::F32>> out) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 3)
    return ffi::Error::InvalidArgument("specjax attention: bad ranks");
  Shape d;
  const int64_t b_dim = qd[0];
  d.t = qd[1], d.n = qd[2], d.h = qd[3], d.g = kd[1], d.s = kd[2], d.scale = scale;
  if (kd[0] != b_dim || kd[3] != d.h || d.g < 1 || d.n % d.g || md[0] != b_dim ||
      md[1] != d.t || md[2] != d.s || !std::equal(kd.begin(), kd.end(), vd.begin()))
    return ffi::Error::InvalidArgument("specjax attention: shapes disagree");
  d.r = d.n / d.g;
  if (b_dim == 0 || d.t == 0 || d.n == 0) return ffi::Error::Success();
  // Enough spans that every thread has work (two per thread where the slots allow).
  const int64_t heads = b_dim * d.g;
  const int64_t want = (2 * specjax::SpinPool::Get().threads() + heads - 1) / heads;
  d.spans = std::max<int64_t>(1, std::min<int64_t>(want, d.s / kMinSpan));
  d.span = std::max<int64_t>(1, (d.s + d.spans - 1) / d.spans);
  d.spans = std::max<int64_t>(1, (d.s + d.span - 1) / d.span);  // no span starts past S
  const int64_t rows = d.t * d.r, width = d.h + 2;
  std::vector<float> parts(heads * d.spans * rows * width);
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const bool* mp = mask.typed_data();
  float* op = out->typed_data();
  float* pp = parts.data();
  specjax::SpinPool::Get().Run(heads * d.spans, [=, &d](int64_t task) {
    const int64_t head = task / d.spans, span = task % d.spans;
    const int64_t s0 = span * d.span, s1 = std::min(d.s, s0 + d.span);
    Span(qp, kp, vp, mp, pp + task * rows * width, head / d.g, head % d.g, s0, s1, d);
  });
  // Merge the spans of each (row, KV head, query) in a fixed order.
  for (int64_t head = 0; head < heads; ++head) {
    const int64_t b = head / d.g, g = head % d.g;
    for (int64_t t = 0; t < d.t; ++t) {
      for (int64_t r = 0; r < d.r; ++r) {
        const int64_t row = t * d.r + r;
        float* o = op + ((b * d.t + t) * d.n + g * d.r + r) * d.h;
        float top = -INFINITY;
        for (int64_t c = 0; c < d.spans; ++c)
          top = std::max(top, pp[((head * d.spans + c) * rows + row) * width]);
        std::fill(o, o + d.h, 0.f);
        if (top == -INFINITY) {  // no slot seen: XLA's softmax of equal scores
          const float* vh = vp + head * d.s * d.h;
          for (int64_t s = 0; s < d.s; ++s) Axpy(o, 1.f / d.s, vh + s * d.h, d.h);
          continue;
        }
        float total = 0.f;
        for (int64_t c = 0; c < d.spans; ++c) {
          const float* part = pp + ((head * d.spans + c) * rows + row) * width;
          if (part[0] == -INFINITY) continue;
          const float w = std::exp(part[0] - top);
          total += w * part[1];
          Axpy(o, w, part + 2, d.h);
        }
        const float inv = 1.f / total;
        for (int64_t i = 0; i < d.h; ++i) o[i] *= inv;
      }
    }
  }
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
