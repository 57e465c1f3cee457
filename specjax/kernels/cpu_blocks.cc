// Products with block-quantized weights for XLA:CPU, called through JAX's FFI.
//
//   specjax_blocks_q4_1: y[M, N] = x[M, K] @ W^T, W[N, K] in GGUF q4_1 blocks
//   specjax_blocks_q8_0: y[M, N] = x[M, K] @ W^T, W[N, K] in GGUF q8_0 blocks
//   specjax_blocks_q4_1_r8: the q4_1 product with W's rows in groups of 8 (below, "r8")
//
// Weights come as rows of blocks of 32 values along K: qs (uint8 [N, K/32, 16] for
// q4_1, low nibble value j and high nibble value j + 16; for q8_0 uint8 [N, K/32, 32]
// holding q + 128, so that every weight byte is unsigned), a float16 scale d [N, K/32]
// and, for q4_1, a float16 offset m [N, K/32], as GGUF stores them: w = d * q (+ m). A
// q4_1 block is 20 bytes (5 bits a weight; with float32 scales it was 24, and the
// quantized draft's forward read 13% more).
// Each row of x is rounded, block by block, to 8-bit integers with a float scale (as
// llama.cpp does for these formats), so one block product is a single integer dot
// (AVX-512 VNNI where the CPU has it, AVX2's maddubs otherwise, and plain C++ in the
// "scalar" build that kernels/cpu.py uses only for exactness tests):
//
//   y[i, n] = sum_b  d[n, b] * dx[i, b] * (q[n, b] . qx[i, b])  +  m[n, b] * sum(x[i, b])
//
// (for q8_0 the bias is taken back with d[n, b] * dx[i, b] * 128 * sum(qx[i, b]), except
// on the AVX2 path, which flips the bytes back to signed values and multiplies those). The
// q4_1 offset term uses the exact float sum of x's block, so the only approximation is
// x's rounding (relative error ~1/254 per value). The weights stream from memory once
// per call (q4_1: 5 bits a weight), their rows split over spin_pool.h's threads.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "specjax/kernels/simd.h"
#include "specjax/kernels/spin_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// IEEE binary16 -> float32, exactly (the plain C++ path; the vector paths use F16C).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (man << 13);  // inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(man & 0x400)) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

constexpr int64_t kMaxRows = 1 << 20;  // rows of x (measured dispatch uses <= 64)
constexpr int kBlock = 32;

// One block of x rounded to 8-bit integers, given its largest magnitude and its sum.
inline void QuantizeBlock(const float* v, float amax, float sum, int8_t* qx, float* dx, float* sx,
                          bool biased) {
  const float d = amax / 127.f;
  const float inv = d > 0.f ? 1.f / d : 0.f;
  int32_t qsum = 0;
  for (int j = 0; j < kBlock; ++j) {
    const int8_t q = static_cast<int8_t>(std::nearbyint(v[j] * inv));
    qx[j] = q;
    qsum += q;
  }
  *dx = d;
  *sx = biased ? -128.f * d * static_cast<float>(qsum) : sum;
}

// x's rows as 8-bit blocks: qx [M, nb, 32], scale dx [M, nb], exact sums sx [M, nb].
// For q8_0, sx instead holds -128 * dx * sum(qx), the bias correction per block.
// A block's sum adds its 32 values in order; eight blocks are summed side by side, so that
// the eight chains of additions overlap (one chain at a time waited on each addition: about
// a microsecond a call at K = 576, while the other threads waited).
void QuantizeRows(const float* x, int64_t m_rows, int64_t nb, int8_t* qx, float* dx, float* sx,
                  bool biased) {
  constexpr int kSide = 8;
  const int64_t blocks = m_rows * nb;
  int64_t i = 0;
  for (; i + kSide <= blocks; i += kSide) {
    const float* v = x + i * kBlock;
    float amax[kSide] = {}, sum[kSide] = {};
    for (int j = 0; j < kBlock; ++j)
      for (int l = 0; l < kSide; ++l) {
        amax[l] = std::max(amax[l], std::fabs(v[l * kBlock + j]));
        sum[l] += v[l * kBlock + j];
      }
    for (int l = 0; l < kSide; ++l)
      QuantizeBlock(v + l * kBlock, amax[l], sum[l], qx + (i + l) * kBlock, dx + i + l, sx + i + l,
                    biased);
  }
  for (; i < blocks; ++i) {
    const float* v = x + i * kBlock;
    float amax = 0.f, sum = 0.f;
    for (int j = 0; j < kBlock; ++j) {
      amax = std::max(amax, std::fabs(v[j]));
      sum += v[j];
    }
    QuantizeBlock(v, amax, sum, qx + i * kBlock, dx + i, sx + i, biased);
  }
}

// x's 8-bit blocks in pairs, for q4_1's two-block step: blocks b, b + 1 (b even) of a row
// as [b's values 0-15, b+1's 0-15, b's 16-31, b+1's 16-31] (what the low and the high
// nibbles of the two weight blocks, loaded together, hold), and each block's scale four
// times over (dx4 [M, nb, 4]). An odd last block stays in value order.
void PairRows(const int8_t* qx, const float* dx, int64_t m_rows, int64_t nb, int8_t* qxp,
              float* dx4) {
  for (int64_t i = 0; i < m_rows; ++i) {
    const int8_t* row = qx + i * nb * kBlock;
    int8_t* out = qxp + i * nb * kBlock;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      for (int half = 0; half < 2; ++half)
        for (int blk = 0; blk < 2; ++blk)
          std::memcpy(out + b * kBlock + (2 * half + blk) * 16, row + (b + blk) * kBlock + 16 * half, 16);
    }
    if (b < nb) std::memcpy(out + b * kBlock, row + b * kBlock, kBlock);
    for (int64_t c = 0; c < nb; ++c)
      for (int j = 0; j < 4; ++j) dx4[(i * nb + c) * 4 + j] = dx[i * nb + c];
  }
}

enum class Format { kQ4_1, kQ8_0 };

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SPECJAX_BLOCKS_SIMD 1
constexpr bool kBiasedDot = true;  // q8_0 dots of the biased bytes, corrected through sx
constexpr int kTileRows = 4;       // rows of W per tile (4 x 4 accumulators of 32 registers)
#elif defined(__AVX2__) && defined(__FMA__)
#define SPECJAX_BLOCKS_SIMD 1
constexpr bool kBiasedDot = false;  // q8_0 dots of the signed bytes: no correction
constexpr int kTileRows = 2;        // 2 x 4 accumulators of 16 registers
#else
constexpr bool kBiasedDot = true;
#endif

template <Format F>
constexpr int64_t BlockBytes() {
  return F == Format::kQ4_1 ? 16 : 32;
}

#if defined(SPECJAX_BLOCKS_SIMD)
// The 32 unsigned weight bytes of one block in value order (u8 x s8 integer dots).
template <Format F>
inline __m256i WeightBytes(const uint8_t* q) {
  if constexpr (F == Format::kQ4_1) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    return _mm256_set_m128i(hi, lo);
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  }
}

// 8 int32 partial sums of u8(a) * s8(b) over 32 byte pairs (AVX-512 VNNI; AVX2's maddubs
// would saturate on biased q8_0 bytes, 255 * 127 * 2 > 32767).
template <Format F>
inline __m256i DotBytes(__m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (F == Format::kQ4_1) {  // nibbles: 15 * 127 * 2 fits in int16
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones);
  } else {  // |q| <= 128 against |x| <= 127: 128 * 127 * 2 fits in int16
    const __m256i q = _mm256_xor_si256(a, _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i dot = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(b, q));
    return _mm256_madd_epi16(dot, ones);
  }
#endif
}

// q4_1, two blocks at once: 8 int32 partial sums, lanes 0-3 block b's and 4-7 block b+1's,
// of the low nibbles `lo` against `xlo` plus the high nibbles `hi` against `xhi` (PairRows'
// layout). AVX2: two maddubs add in int16 without overflow (4 * 15 * 127 < 32767).
inline __m256i DotPair(__m256i lo, __m256i hi, __m256i xlo, __m256i xhi) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo), hi, xhi);
#else
  const __m256i sum = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
  return _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
#endif
}

#endif

#if defined(SPECJAX_BLOCKS_SIMD)
// Rows [n, n + kTileRows) of W against rows [m0, m0 + MB) of x; MB is a template argument so that
// the 4 x MB accumulators stay in registers.
// q4_1 takes its blocks two at a time (qxp, dx4: PairRows' layout): one 256-bit load holds
// both blocks' nibbles, with half the conversions and multiply-adds per weight. Measured on
// a 2-core Zen 4, one thread, 1536 x 576 weights streamed from memory, ns per block of W:
// 5 rows of x 5.2 -> 3.3 (AVX-512), 6.8 -> 4.2 (AVX2); one row 2.1 -> 1.7 (AVX2) and
// 1.5 either way on AVX-512, where one thread already streams what one core can fetch.
template <Format F, int MB>
inline void Tile(const int8_t* qx, const int8_t* qxp, const float* dx, const float* dx4,
                 const float* sx, const uint8_t* qs, const uint16_t* d, const uint16_t* mins,
                 float* y, int64_t nb, int64_t n_dim, int64_t n, int64_t m0) {
  constexpr int64_t kQb = BlockBytes<F>();
  constexpr int R = kTileRows;
  __m256 acc[MB][R];
  for (int i = 0; i < MB; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
  int64_t b = 0;
  // Eight blocks at a time, each row's eight float16 scales are converted in one
  // instruction and multiplied by x's eight scales in another; each block (or pair) then
  // takes its product d * dx from that vector by a permute. The products are the same
  // float32 multiplications as one block at a time (the tails below): results are bitwise
  // the same, for fewer instructions per block. On the Xeon of BENCHMARKS.md (kernel_ab.py,
  // one row): the q8_0 head 1.13x (AVX-512) and 1.12x (AVX2) faster, q4_1 at K = 1536
  // 1.1x, at K = 576 within noise (there one thread's product runs at 21 GB/s from L2 or
  // from memory alike, two at 36: what bounds it is not the scales' instructions).
  if constexpr (F == Format::kQ4_1) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i lane = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    for (; b + 8 <= nb; b += 8) {
      __m256 xd8[MB];
      for (int i = 0; i < MB; ++i) xd8[i] = _mm256_loadu_ps(dx + (m0 + i) * nb + b);
      for (int r = 0; r < R; ++r) {
        const int64_t row = n + r;
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + row * nb + b)));
        __m256 dwx[MB];
        for (int i = 0; i < MB; ++i) dwx[i] = _mm256_mul_ps(d8, xd8[i]);
        for (int p = 0; p < 4; ++p) {  // blocks b + 2p, b + 2p + 1: lanes 0-3 and 4-7
          const __m256i spread = _mm256_add_epi32(_mm256_srli_epi32(lane, 2), _mm256_set1_epi32(2 * p));
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (row * nb + b + 2 * p) * kQb));
          const __m256i lo = _mm256_and_si256(raw, low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
          for (int i = 0; i < MB; ++i) {
            const int8_t* px = qxp + ((m0 + i) * nb + b + 2 * p) * kBlock;
            const __m256i xlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(px));
            const __m256i xhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(px + kBlock));
            const __m256i dot = DotPair(lo, hi, xlo, xhi);
            acc[i][r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dwx[i], spread), _mm256_cvtepi32_ps(dot), acc[i][r]);
          }
        }
      }
    }
    const __m256i spread = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
    for (; b + 2 <= nb; b += 2) {
      __m256i xlo[MB], xhi[MB];
      __m256 xd[MB];
      for (int i = 0; i < MB; ++i) {
        const int8_t* p = qxp + ((m0 + i) * nb + b) * kBlock;
        xlo[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        xhi[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kBlock));
        xd[i] = _mm256_loadu_ps(dx4 + ((m0 + i) * nb + b) * 4);
      }
      for (int r = 0; r < R; ++r) {
        const int64_t row = n + r;
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + (row * nb + b) * kQb));
        const __m256i lo = _mm256_and_si256(raw, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        uint32_t halves;  // the two blocks' float16 scales
        std::memcpy(&halves, d + row * nb + b, sizeof(halves));
        const __m128 dpair = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(halves)));
        const __m256 dw = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dpair), spread);
        for (int i = 0; i < MB; ++i) {
          const __m256i dot = DotPair(lo, hi, xlo[i], xhi[i]);
          acc[i][r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, xd[i]), _mm256_cvtepi32_ps(dot), acc[i][r]);
        }
      }
    }
  }
  if constexpr (F == Format::kQ8_0) {
    for (; b + 8 <= nb; b += 8) {
      __m256 xd8[MB];
      for (int i = 0; i < MB; ++i) xd8[i] = _mm256_loadu_ps(dx + (m0 + i) * nb + b);
      for (int r = 0; r < R; ++r) {
        const int64_t row = n + r;
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + row * nb + b)));
        __m256 dwx[MB];
        for (int i = 0; i < MB; ++i) dwx[i] = _mm256_mul_ps(d8, xd8[i]);
        for (int c = 0; c < 8; ++c) {
          const __m256i w = WeightBytes<F>(qs + (row * nb + b + c) * kQb);
          for (int i = 0; i < MB; ++i) {
            const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + ((m0 + i) * nb + b + c) * kBlock));
            const __m256i dot = DotBytes<F>(w, xb);
            const __m256 dwc = _mm256_permutevar8x32_ps(dwx[i], _mm256_set1_epi32(c));
            acc[i][r] = _mm256_fmadd_ps(dwc, _mm256_cvtepi32_ps(dot), acc[i][r]);
          }
        }
      }
    }
  }
  for (; b < nb; ++b) {
    __m256i xb[MB];
    float xd[MB];
    for (int i = 0; i < MB; ++i) {
      xb[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + ((m0 + i) * nb + b) * kBlock));
      xd[i] = dx[(m0 + i) * nb + b];
    }
    for (int r = 0; r < R; ++r) {
      const int64_t row = n + r;
      const __m256i w = WeightBytes<F>(qs + (row * nb + b) * kQb);
      const float dw = _cvtsh_ss(d[row * nb + b]);
      for (int i = 0; i < MB; ++i) {
        const __m256i dot = DotBytes<F>(w, xb[i]);
        acc[i][r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[i]), _mm256_cvtepi32_ps(dot), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int r = 0; r < R; ++r) {
      float total = specjax::Sum8(acc[i][r]);
      if (F == Format::kQ4_1 || kBiasedDot) {  // the offsets' term, eight blocks at a time
        const uint16_t* wr = (F == Format::kQ4_1 ? mins : d) + (n + r) * nb;
        const float* xs = sx + (m0 + i) * nb;
        __m256 bias = _mm256_setzero_ps();
        int64_t b = 0;
        for (; b + 8 <= nb; b += 8) {
          const __m256 w8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + b)));
          bias = _mm256_fmadd_ps(w8, _mm256_loadu_ps(xs + b), bias);
        }
        total += specjax::Sum8(bias);
        for (; b < nb; ++b) total += _cvtsh_ss(wr[b]) * xs[b];
      }
      y[(m0 + i) * n_dim + n + r] = total;
    }
  }
}
#endif

template <Format F>
void RowsChunk(const int8_t* qx, const int8_t* qxp, const float* dx, const float* dx4,
               const float* sx, const uint8_t* qs, const uint16_t* d, const uint16_t* mins,
               float* y, int64_t m_rows, int64_t nb, int64_t n_dim, int64_t lo, int64_t hi) {
  constexpr int64_t kQb = BlockBytes<F>();
  int64_t n = lo;
#if defined(SPECJAX_BLOCKS_SIMD)
  constexpr int64_t R = kTileRows;
  constexpr int64_t kAhead = 2 * R;  // rows: prefetch the weights of the tile after next
  for (; n + R <= hi; n += R) {
    if (n + kAhead + R <= hi) {
      const char* next = reinterpret_cast<const char*>(qs + (n + kAhead) * nb * kQb);
      for (int64_t off = 0; off < R * nb * kQb; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
      const char* dn = reinterpret_cast<const char*>(d + (n + kAhead) * nb);
      for (int64_t off = 0; off < R * nb * 2; off += 64) _mm_prefetch(dn + off, _MM_HINT_T0);
      if (F == Format::kQ4_1) {
        const char* mn = reinterpret_cast<const char*>(mins + (n + kAhead) * nb);
        for (int64_t off = 0; off < R * nb * 2; off += 64) _mm_prefetch(mn + off, _MM_HINT_T0);
      }
    }
    int64_t m0 = 0;
    for (; m0 + 4 <= m_rows; m0 += 4) Tile<F, 4>(qx, qxp, dx, dx4, sx, qs, d, mins, y, nb, n_dim, n, m0);
    switch (m_rows - m0) {
      case 3: Tile<F, 3>(qx, qxp, dx, dx4, sx, qs, d, mins, y, nb, n_dim, n, m0); break;
      case 2: Tile<F, 2>(qx, qxp, dx, dx4, sx, qs, d, mins, y, nb, n_dim, n, m0); break;
      case 1: Tile<F, 1>(qx, qxp, dx, dx4, sx, qs, d, mins, y, nb, n_dim, n, m0); break;
      default: break;
    }
  }
#endif
  for (; n < hi; ++n) {
    for (int64_t i = 0; i < m_rows; ++i) {
      float total = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* q = qs + (n * nb + b) * kQb;
        const int8_t* xq = qx + (i * nb + b) * kBlock;
        int32_t dot = 0;
        for (int j = 0; j < kBlock; ++j) {
          int32_t wj;
          if constexpr (F == Format::kQ4_1) {
            wj = j < 16 ? (q[j] & 0x0F) : (q[j - 16] >> 4);
          } else {
            wj = kBiasedDot ? q[j] : q[j] - 128;  // biased: the correction is in sx
          }
          dot += wj * xq[j];
        }
        total += HalfToFloat(d[n * nb + b]) * dx[i * nb + b] * static_cast<float>(dot);
        if (F == Format::kQ4_1 || kBiasedDot)
          total += HalfToFloat((F == Format::kQ4_1 ? mins : d)[n * nb + b]) * sx[i * nb + b];
      }
      y[i * n_dim + n] = total;
    }
  }
}

// ---- q4_1 in groups of 8 rows ("r8", models/quant.py interleave_rows8) ------------------
// W's rows in groups of 8: for group g and block b, 128 bytes = 4 chunks c of [8 rows x 4
// bytes], chunk c holding bytes 4c..4c+3 of each row's 16 (low nibbles: values 4c..4c+3,
// high nibbles: values 16+4c..16+4c+3); the scales d and offsets m as [N/8, nb, 8], row r
// of a group at lane r. One 256-bit integer dot of a chunk's nibbles against x's 4 bytes,
// broadcast, adds 4 products for 8 rows at once: 8 dots a block give the block products of
// 8 rows, then one conversion and two FMAs (scale, offset) serve all 8. That is about half
// the instructions per block and row of x of the pairs layout (Tile above), where from 2
// rows of x the product is bound by them: the tile alone ran 1.4-2.0x faster per row of x,
// at 1 to 9 rows (experiments/cpu_paths/results/blocks_tile_xeon.txt). Integer sums are
// exact on every path, so the paths give bitwise-equal results; a row of x is summed alone,
// block by block in order, whatever the other rows.
constexpr int64_t kGroup = 8;  // W rows a group

#if defined(SPECJAX_BLOCKS_SIMD)
// 8 int32 sums, lane r: row r's integer block product with x's block xq (values in order).
inline __m256i Dot8Rows(const __m256i* lo, const __m256i* hi, const int8_t* xq) {
  int32_t xw[8];
  std::memcpy(xw, xq, sizeof(xw));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    s0 = _mm256_dpbusd_epi32(s0, lo[c], _mm256_set1_epi32(xw[c]));
    s1 = _mm256_dpbusd_epi32(s1, hi[c], _mm256_set1_epi32(xw[4 + c]));
  }
  return _mm256_add_epi32(s0, s1);
#else
  // maddubs: two products a 16-bit lane, each pair at most 2 * 15 * 127 = 3810 in
  // magnitude; eight of them add to at most 30480, below int16's limit.
  __m256i s = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[c], _mm256_set1_epi32(xw[c])));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[c], _mm256_set1_epi32(xw[4 + c])));
  }
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
}

#if defined(__AVX512VL__)
constexpr int kR8Groups = 2;  // groups a tile: 4 x 2 accumulators and 8 nibble vectors
#else
constexpr int kR8Groups = 1;  // AVX2's 16 registers
#endif

// Groups [g0, g0 + G) of W against rows [m0, m0 + MB) of x.
template <int MB, int G>
inline void Rows8Tile(const int8_t* qx, const float* dx, const float* sx, const uint8_t* qs,
                      const uint16_t* d, const uint16_t* mins, float* y, int64_t nb,
                      int64_t n_dim, int64_t g0, int64_t m0) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[MB][G];
  for (int i = 0; i < MB; ++i)
    for (int g = 0; g < G; ++g) acc[i][g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int g = 0; g < G; ++g) {
      const int64_t gb = (g0 + g) * nb + b;
      const uint8_t* w = qs + gb * 4 * 32;
      __m256i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c));
        lo[c] = _mm256_and_si256(raw, low4);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + gb * kGroup)));
      const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + gb * kGroup)));
      for (int i = 0; i < MB; ++i) {
        const int64_t xb = (m0 + i) * nb + b;
        const __m256i dot = Dot8Rows(lo, hi, qx + xb * kBlock);
        const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(dx[xb]));
        acc[i][g] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[i][g]);
        acc[i][g] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx[xb]), acc[i][g]);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(y + (m0 + i) * n_dim + (g0 + g) * kGroup, acc[i][g]);
}

template <int G>
inline void Rows8Tiles(const int8_t* qx, const float* dx, const float* sx, const uint8_t* qs,
                       const uint16_t* d, const uint16_t* mins, float* y, int64_t m_rows,
                       int64_t nb, int64_t n_dim, int64_t g0) {
  int64_t m0 = 0;
  for (; m0 + 4 <= m_rows; m0 += 4) Rows8Tile<4, G>(qx, dx, sx, qs, d, mins, y, nb, n_dim, g0, m0);
  switch (m_rows - m0) {
    case 3: Rows8Tile<3, G>(qx, dx, sx, qs, d, mins, y, nb, n_dim, g0, m0); break;
    case 2: Rows8Tile<2, G>(qx, dx, sx, qs, d, mins, y, nb, n_dim, g0, m0); break;
    case 1: Rows8Tile<1, G>(qx, dx, sx, qs, d, mins, y, nb, n_dim, g0, m0); break;
    default: break;
  }
}
#endif

// Groups [lo, hi) of W (8 rows each) against every row of x.
void Rows8Chunk(const int8_t* qx, const float* dx, const float* sx, const uint8_t* qs,
                const uint16_t* d, const uint16_t* mins, float* y, int64_t m_rows, int64_t nb,
                int64_t n_dim, int64_t lo, int64_t hi) {
  int64_t g = lo;
#if defined(SPECJAX_BLOCKS_SIMD)
  constexpr int64_t G = kR8Groups;
  for (; g + G <= hi; g += G) {
    if (g + 3 * G <= hi) {  // the weights of the tile after next
      const char* next = reinterpret_cast<const char*>(qs + (g + 2 * G) * nb * 128);
      for (int64_t off = 0; off < G * nb * 128; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
      const char* dn = reinterpret_cast<const char*>(d + (g + 2 * G) * nb * kGroup);
      const char* mn = reinterpret_cast<const char*>(mins + (g + 2 * G) * nb * kGroup);
      for (int64_t off = 0; off < G * nb * kGroup * 2; off += 64) {
        _mm_prefetch(dn + off, _MM_HINT_T0);
        _mm_prefetch(mn + off, _MM_HINT_T0);
      }
    }
    Rows8Tiles<G>(qx, dx, sx, qs, d, mins, y, m_rows, nb, n_dim, g);
  }
  for (; g < hi; ++g) Rows8Tiles<1>(qx, dx, sx, qs, d, mins, y, m_rows, nb, n_dim, g);
#endif
  for (; g < hi; ++g) {  // plain C++: the same sums in the same order
    for (int64_t i = 0; i < m_rows; ++i) {
      for (int r = 0; r < kGroup; ++r) {
        float total = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t gb = g * nb + b, xb = i * nb + b;
          const uint8_t* w = qs + gb * 128;
          const int8_t* xq = qx + xb * kBlock;
          int32_t dot = 0;
          for (int c = 0; c < 4; ++c)
            for (int j = 0; j < 4; ++j) {
              const uint8_t byte = w[(c * kGroup + r) * 4 + j];
              dot += (byte & 0x0F) * xq[4 * c + j] + (byte >> 4) * xq[16 + 4 * c + j];
            }
          total = std::fma(HalfToFloat(d[gb * kGroup + r]) * dx[xb], static_cast<float>(dot), total);
          total = std::fma(HalfToFloat(mins[gb * kGroup + r]), sx[xb], total);
        }
        y[i * n_dim + g * kGroup + r] = total;
      }
    }
  }
}

template <Format F, bool kR8 = false>
ffi::Error Blocks(ffi::AnyBuffer x, ffi::AnyBuffer qs, ffi::AnyBuffer d,
                  ffi::AnyBuffer mins, ffi::Result<ffi::AnyBuffer> y) {
  auto xd = x.dimensions();
  auto qd = qs.dimensions();
  if (xd.size() < 1 || qd.size() != 3 || qd[2] != BlockBytes<F>())
    return ffi::Error::InvalidArgument("specjax blocks: bad operand ranks or block size");
  const int64_t k_dim = xd.back();
  int64_t m_rows = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) m_rows *= xd[i];
  const int64_t n_dim = qd[0], nb = qd[1];
  if (nb * kBlock != k_dim)
    return ffi::Error::InvalidArgument("specjax blocks: K is not 32 x the number of blocks");
  if (x.element_type() != ffi::DataType::F32 || d.element_type() != ffi::DataType::F16 ||
      mins.element_type() != ffi::DataType::F16 || d.element_count() != n_dim * nb ||
      mins.element_count() != n_dim * nb)
    return ffi::Error::InvalidArgument(
        "specjax blocks: x must be float32 and the scales d, m float16 [N, K/32]");
  if (m_rows > kMaxRows)
    return ffi::Error::InvalidArgument("specjax blocks: too many rows for the kernel");
  if (kR8 && n_dim % kGroup != 0)
    return ffi::Error::InvalidArgument("specjax blocks: the 8-row layout needs rows in groups of 8");
  std::unique_ptr<int8_t[]> qx(new int8_t[m_rows * k_dim]);
  std::unique_ptr<float[]> dx(new float[m_rows * nb]), sx(new float[m_rows * nb]);
  QuantizeRows(x.typed_data<float>(), m_rows, nb, qx.get(), dx.get(), sx.get(),
               F == Format::kQ8_0 && kBiasedDot);
  std::unique_ptr<int8_t[]> qx2;
  std::unique_ptr<float[]> dx4;
  if (F == Format::kQ4_1 && !kR8) {
    qx2.reset(new int8_t[m_rows * k_dim]);
    dx4.reset(new float[m_rows * nb * 4]);
    PairRows(qx.get(), dx.get(), m_rows, nb, qx2.get(), dx4.get());
  }
  const int8_t* qxp = qx.get();
  const int8_t* qx2p = qx2.get();
  const float* dx4p = dx4.get();
  const float* dxp = dx.get();
  const float* sxp = sx.get();
  const uint8_t* qp = static_cast<const uint8_t*>(qs.untyped_data());
  const uint16_t* dp = static_cast<const uint16_t*>(d.untyped_data());
  const uint16_t* mp = static_cast<const uint16_t*>(mins.untyped_data());
  float* yp = y->typed_data<float>();
  const int64_t threads = specjax::SpinPool::Get().threads();
  if constexpr (kR8) {  // two chunks a thread, of whole tiles of groups
    const int64_t groups = n_dim / kGroup;
    int64_t per = (groups + 2 * threads - 1) / (2 * threads);
    per = std::max<int64_t>(2, (per + 1) / 2 * 2);
    const int64_t chunks = (groups + per - 1) / per;
    specjax::SpinPool::Get().Run(chunks, [=](int64_t c) {
      Rows8Chunk(qxp, dxp, sxp, qp, dp, mp, yp, m_rows, nb, n_dim, c * per,
                 std::min(groups, (c + 1) * per));
    });
    return ffi::Error::Success();
  }
  // Two chunks a thread: measured in a draft forward (2-core Zen 4, 15 interleaved rounds),
  // 10% faster at one row and 7% at five than eight a thread (fewer hand-offs), and
  // as fast as one a thread (where a late worker's chunk waits for the caller).
  int64_t rows = (n_dim + 2 * threads - 1) / (2 * threads);
  rows = std::max<int64_t>(16, (rows + 3) / 4 * 4);
  const int64_t chunks = (n_dim + rows - 1) / rows;
  specjax::SpinPool::Get().Run(chunks, [=](int64_t c) {
    RowsChunk<F>(qxp, qx2p, dxp, dx4p, sxp, qp, dp, mp, yp, m_rows, nb, n_dim, c * rows,
                 std::min(n_dim, (c + 1) * rows));
  });
  return ffi::Error::Success();
}

}  // namespace

#define SPECJAX_BLOCKS_HANDLER(symbol, format)                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, Blocks<format>,         \
                                ffi::Ffi::Bind()                \
                                    .Arg<ffi::AnyBuffer>()      \
                                    .Arg<ffi::AnyBuffer>()      \
                                    .Arg<ffi::AnyBuffer>()      \
                                    .Arg<ffi::AnyBuffer>()      \
                                    .Ret<ffi::AnyBuffer>());

SPECJAX_BLOCKS_HANDLER(specjax_blocks_q4_1, Format::kQ4_1)
SPECJAX_BLOCKS_HANDLER(specjax_blocks_q8_0, Format::kQ8_0)

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_blocks_q4_1_r8, (Blocks<Format::kQ4_1, true>),
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
