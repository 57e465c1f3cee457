// Small SIMD helpers shared by the CPU kernels (cpu_linear.cc, cpu_blocks.cc,
// cpu_attention.cc). Everything here needs AVX2 + FMA; callers guard their use.
#ifndef SPECJAX_KERNELS_SIMD_H_
#define SPECJAX_KERNELS_SIMD_H_

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace specjax {

#if defined(__AVX2__) && defined(__FMA__)
// The sum of the 8 lanes of v.
inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// [Sum8(a[0]), ..., Sum8(a[7])] in one register: eight horizontal sums for the price of
// about two (a transpose by pairwise adds).
inline __m256 Sum8x8(const __m256* a) {
  const __m256 t01 = _mm256_hadd_ps(a[0], a[1]), t23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t45 = _mm256_hadd_ps(a[4], a[5]), t67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 lo = _mm256_hadd_ps(t01, t23), hi = _mm256_hadd_ps(t45, t67);
  // lo = [s0..s3 of lanes 0-3 | s0..s3 of lanes 4-7], hi the same for s4..s7.
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

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
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}
#endif

}  // namespace specjax

#endif  // SPECJAX_KERNELS_SIMD_H_
