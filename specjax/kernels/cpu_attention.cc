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
// each value is read once for all T * R queries that share its KV head. The slots up to
// the last one any query sees are split into spans of kSpan, one task per (row, KV head,
// span), so that the threads share a row's KV heads evenly; each span keeps its own
// maximum, sum and weighted values, merged at the end as split softmaxes are (the maximum
// shifts each span's terms by exp(m_span - m)).
// Slots no query sees are skipped. A query that sees no slot gets the mean of every value,
// as XLA's softmax of equal (-1e30) scores gives. A NaN in a query, or in a key or value
// it sees, makes its attention NaN, as in XLA (which also spreads a NaN in a slot no query
// sees, through its zero weight: here such a slot is never read); so does a score that
// overflowed to +-inf (XLA gives NaN for +inf, the unseen slots' mean for all -inf).
//
// The arithmetic of one query does not depend on the other queries or on T (spans have
// fixed bounds; one that a query does not reach merges as nothing): a one-row step and a
// five-row verification give bitwise-equal attention for the same query and cache.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "specjax/kernels/simd.h"
#include "specjax/kernels/spin_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#ifndef SPECJAX_ATTENTION_SPAN
#define SPECJAX_ATTENTION_SPAN 128
#endif
// Slots per task: at 512 slots half full, 128 ran 1-9 queries 3-12% faster than 64 or 256
// on the Xeon of BENCHMARKS.md (SPECJAX_ATTENTION_SPAN sets it at build time).
constexpr int64_t kSpan = SPECJAX_ATTENTION_SPAN;
constexpr int64_t kBlock = 64;    // slots per pass over the values: they stay in L1

#if defined(__AVX2__) && defined(__FMA__)
// Queries per pass and 8-float chunks of a query's values held in registers: 3 x 8
// accumulators of AVX-512VL's 32 registers, 3 x 4 of AVX2's 16.
constexpr int kQueries = 3;
#if defined(__AVX512VL__)
constexpr int kScoreQueries = 3;  // 3 queries x 8 keys of sums in the scores
constexpr int kChunks = 8;
#else
constexpr int kScoreQueries = 1;
constexpr int kChunks = 4;
#endif

// scores[u][j] = q[u] . keys[j] for the eight keys j = j0..j0+7 and Q queries.
template <int Q>
inline void Scores8(const float* const* q, const float* k, const int32_t* slots, int64_t h,
                    float* const* scores, int64_t j0) {
  __m256 acc[Q][8];
  for (int u = 0; u < Q; ++u)
    for (int c = 0; c < 8; ++c) acc[u][c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < h; i += 8) {
    __m256 qi[Q];
    for (int u = 0; u < Q; ++u) qi[u] = _mm256_loadu_ps(q[u] + i);
    for (int c = 0; c < 8; ++c) {
      const __m256 key = _mm256_loadu_ps(k + slots[j0 + c] * h + i);
      for (int u = 0; u < Q; ++u) acc[u][c] = _mm256_fmadd_ps(qi[u], key, acc[u][c]);
    }
  }
  for (int u = 0; u < Q; ++u) _mm256_storeu_ps(scores[u] + j0, specjax::Sum8x8(acc[u]));
}

// acc[u][i0:i0 + 8C] += sum over j in [j0, j1) of w[u][j] * values[j][i0:i0 + 8C], slot
// by slot in order (one fused multiply-add per slot and lane, as for a lone query), with
// the Q queries' sums in registers and each value loaded once for all of them.
template <int Q, int C>
inline void Weigh(float* const* acc, const float* const* w, const float* v,
                  const int32_t* slots, int64_t j0, int64_t j1, int64_t h, int64_t i0) {
  __m256 a[Q][C];
  for (int u = 0; u < Q; ++u)
    for (int c = 0; c < C; ++c) a[u][c] = _mm256_loadu_ps(acc[u] + i0 + 8 * c);
  for (int64_t j = j0; j < j1; ++j) {
    const float* value = v + slots[j] * h + i0;
    __m256 wj[Q];
    for (int u = 0; u < Q; ++u) wj[u] = _mm256_set1_ps(w[u][j]);
    for (int c = 0; c < C; ++c) {
      const __m256 x = _mm256_loadu_ps(value + 8 * c);
      for (int u = 0; u < Q; ++u) a[u][c] = _mm256_fmadd_ps(wj[u], x, a[u][c]);
    }
  }
  for (int u = 0; u < Q; ++u)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc[u] + i0 + 8 * c, a[u][c]);
}

template <int Q>
void WeighAll(float* const* acc, const float* const* w, const float* v, const int32_t* slots,
              int64_t j0, int64_t j1, int64_t h) {
  int64_t i = 0;
  for (; i + 8 * kChunks <= h; i += 8 * kChunks) Weigh<Q, kChunks>(acc, w, v, slots, j0, j1, h, i);
  for (; i < h; i += 8) Weigh<Q, 1>(acc, w, v, slots, j0, j1, h, i);
}
#endif

// scores[u][j] = q[u] . keys[j] for the n queries q[u] and j in [j0, m) (keys[j] = k +
// slots[j] * h). j0 is a multiple of 8: a key's score is an eight-key transposed sum where
// its block of eight in [0, m) is whole, a lone sum past it, whichever queries share the
// call, so a query's scores do not depend on the others.
void Scores(const float* const* q, int64_t n, const float* k, const int32_t* slots, int64_t j0,
            int64_t m, int64_t h, float* const* scores) {
#if defined(__AVX2__) && defined(__FMA__)
  if (h % 8 == 0) {
    int64_t j = j0;
    for (; j + 8 <= m; j += 8) {  // one block of keys in L1 for every query
      int64_t u = 0;
      for (; u + kScoreQueries <= n; u += kScoreQueries)
        Scores8<kScoreQueries>(q + u, k, slots, h, scores + u, j);
      for (; u < n; ++u) Scores8<1>(q + u, k, slots, h, scores + u, j);
    }
    for (; j < m; ++j)
      for (int64_t u = 0; u < n; ++u) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < h; i += 8)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(q[u] + i), _mm256_loadu_ps(k + slots[j] * h + i),
                                acc);
        scores[u][j] = specjax::Sum8(acc);
      }
    return;
  }
#endif
  for (int64_t u = 0; u < n; ++u)
    for (int64_t j = j0; j < m; ++j) {
      const float* key = k + slots[j] * h;
      float total = 0.f;
      for (int64_t i = 0; i < h; ++i) total += q[u][i] * key[i];
      scores[u][j] = total;
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

// acc[u] += sum over j in [j0, j1) of w[u][j] * values[j] for n queries, slot by slot in
// order: the same sums as one Axpy per query and slot, in blocks of slots whose values stay
// in L1 while every group of queries reads them.
void Weigh(float* const* acc, const float* const* w, int64_t n, const float* v,
           const int32_t* slots, int64_t j0, int64_t j1, int64_t h) {
#if defined(__AVX2__) && defined(__FMA__)
  if (h % 8 == 0) {
    for (int64_t b0 = j0; b0 < j1; b0 += kBlock) {
      const int64_t b1 = std::min(j1, b0 + kBlock);
      int64_t u = 0;
      for (; u + kQueries <= n; u += kQueries)
        WeighAll<kQueries>(acc + u, w + u, v, slots, b0, b1, h);
      if (n - u == 2) WeighAll<2>(acc + u, w + u, v, slots, b0, b1, h);
      if (n - u == 1) WeighAll<1>(acc + u, w + u, v, slots, b0, b1, h);
    }
    return;
  }
#endif
  for (int64_t u = 0; u < n; ++u)
    for (int64_t j = j0; j < j1; ++j) Axpy(acc[u], w[u][j], v + slots[j] * h, h);
}

struct Shape {
  int64_t t, n, g, s, h, r, spans, span;
  float scale;
};

// One task: (row b, KV head g, slots [s0, s1)) for the T * R queries of that head. Writes
// per query its span maximum, sum and unnormalised weighted values to part[q] =
// [max, sum, acc[0:h]] (max = -inf where the query sees none of these slots).
//
// The T query rows usually see the same slots but for the last few (a verification's
// causal mask, a tree's branches): the slots every row sees in the same order (a common
// prefix of their lists) are scored and weighed for all T * R queries at once, each key and
// value read once for all; the rest of each row's slots for its R heads together. Each
// query's arithmetic is what it would be alone.
void Span(const float* q, const float* k, const float* v, const bool* mask, float* part,
          int64_t b, int64_t g, int64_t s0, int64_t s1, const Shape& d) {
  const int64_t width = d.h + 2, len = s1 - s0, nq = d.t * d.r;
  const float* kh = k + (b * d.g + g) * d.s * d.h;
  const float* vh = v + (b * d.g + g) * d.s * d.h;
  const bool* mb = mask + b * d.t * d.s;
  // Scratch kept by each thread between calls (a task allocates nothing once warm).
  thread_local std::vector<int32_t> slots;  // row t's slots at slots[t * len], m[t] of them
  thread_local std::vector<int64_t> m, live;  // live: the queries still to weigh
  thread_local std::vector<float> scores;
  thread_local std::vector<const float*> qs, lw;
  thread_local std::vector<float*> ws, accs, la;
  slots.resize(d.t * len);
  m.resize(d.t);
  int64_t shared = len;  // how many slots all rows' lists begin with
  for (int64_t t = 0; t < d.t; ++t) {
    int32_t* row = slots.data() + t * len;
    int64_t n = 0;
    for (int64_t s = s0; s < s1; ++s)
      if (mb[t * d.s + s]) row[n++] = static_cast<int32_t>(s);
    m[t] = n;
    int64_t same = 0;
    const int64_t most = std::min(shared, n);
    while (same < most && row[same] == slots[same]) ++same;
    shared = same;
  }
  scores.resize(nq * (len + 8));
  qs.resize(nq), ws.resize(nq), accs.resize(nq);
  for (int64_t t = 0; t < d.t; ++t)
    for (int64_t r = 0; r < d.r; ++r) {
      const int64_t u = t * d.r + r;
      qs[u] = q + ((b * d.t + t) * d.n + g * d.r + r) * d.h;
      ws[u] = scores.data() + u * (len + 8);
      accs[u] = part + u * width + 2;
      std::fill(accs[u], accs[u] + d.h, 0.f);
    }
  const int64_t whole = shared / 8 * 8;  // the shared keys in whole blocks of eight
  Scores(qs.data(), nq, kh, slots.data(), 0, whole, d.h, ws.data());
  for (int64_t t = 0; t < d.t; ++t)
    Scores(qs.data() + t * d.r, d.r, kh, slots.data() + t * len, whole, m[t], d.h,
           ws.data() + t * d.r);
  // Softmax terms per query; a query that sees no slot, or whose scores hold a NaN or an
  // overflow, is settled here and weighs nothing.
  live.clear();
  for (int64_t u = 0; u < nq; ++u) {
    float* out = part + u * width;
    float* score = ws[u];
    const int64_t mu = m[u / d.r];
    if (mu == 0) {
      out[0] = -INFINITY;
      out[1] = 0.f;
      continue;
    }
    float top = -INFINITY;
    bool nan = false;
    for (int64_t j = 0; j < mu; ++j) {
      top = std::max(top, score[j] *= d.scale);
      nan |= std::isnan(score[j]);
    }
    if (nan || !std::isfinite(top)) {  // NaN, or an overflowed score: NaN, as in XLA
      out[0] = 0.f;
      out[1] = NAN;
      std::fill(accs[u], accs[u] + d.h, NAN);
      continue;
    }
    for (int64_t j = 0; j < mu; ++j) score[j] -= top;
    ExpInPlace(score, mu);
    float sum = 0.f;
    for (int64_t j = 0; j < mu; ++j) sum += score[j];
    out[0] = top;
    out[1] = sum;
    live.push_back(u);
  }
  lw.clear(), la.clear();
  for (int64_t u : live) lw.push_back(ws[u]), la.push_back(accs[u]);
  Weigh(la.data(), lw.data(), static_cast<int64_t>(live.size()), vh, slots.data(), 0, shared, d.h);
  for (int64_t t = 0, i = 0; t < d.t; ++t) {  // each row's own slots, its live heads together
    int64_t n = 0;
    while (i + n < static_cast<int64_t>(live.size()) && live[i + n] / d.r == t) ++n;
    Weigh(la.data() + i, lw.data() + i, n, vh, slots.data() + t * len, shared, m[t], d.h);
    i += n;
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
  // Spans of kSpan slots, up to the last slot any query sees: a cache fills from slot 0, so
  // spans over all S slots left the tasks past its length empty and the threads uneven
  // (at 512 slots half full, 3 KV heads in 2 spans each: 3 tasks with all the work). The
  // spans' bounds do not depend on the queries, and spans no query of a call reaches
  // merge as nothing: a query's result is bitwise the same in any call.
  const int64_t heads = b_dim * d.g;
  const bool* mp = mask.typed_data();
  int64_t seen = 0;  // one past the last slot any query sees
  for (int64_t i = 0; i < b_dim * d.t; ++i)
    for (int64_t s = d.s - 1; s >= seen; --s)
      if (mp[i * d.s + s]) {
        seen = s + 1;
        break;
      }
  d.span = kSpan;
  d.spans = std::max<int64_t>(1, (seen + kSpan - 1) / kSpan);
  const int64_t rows = d.t * d.r, width = d.h + 2;
  std::vector<float> parts(heads * d.spans * rows * width);
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
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
