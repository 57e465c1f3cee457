// The q4_1 block product's tile alone, on one thread, over weights that stay in L2
// (issue 29, seventh session): how many ns a (block of 32 weights, row of W, row of x)
// costs at 1-9 rows of x, for
//   pairs: specjax/kernels/cpu_blocks.cc's Tile (two blocks of a W row per 256-bit load,
//          one VNNI dot pair, a convert, a permute and an FMA per pair and row of x);
//   pairs2: the same with the dot pair's two dots independent (added after), not chained;
//   rows8: an interleaved layout, 8 W rows' 4-byte chunks of a block in one 256-bit vector,
//          x's 4 bytes broadcast: 8 dots a block for 8 W rows, then one convert and the
//          scales for all 8 (what llama.cpp's repacked 8-row layouts do for q4_0).
// Every variant's sums are checked against a plain reference (offset term included).
//   g++ -O3 -march=native blocks_tile.cc -o /tmp/blocks_tile && /tmp/blocks_tile 1536 576
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static float H2F(uint16_t h) { return _cvtsh_ss(h); }
static uint16_t F2H(float f) { return _cvtss_sh(f, 0); }

struct Problem {
  int64_t n, k, nb, m;
  std::vector<uint8_t> qs;      // [n, nb, 16] nibbles: low = value j, high = value j + 16
  std::vector<uint16_t> d, mn;  // [n, nb]
  std::vector<int8_t> qx;       // [m, nb, 32] value order
  std::vector<int8_t> qxp;      // [m, nb, 32] pairs layout (cpu_blocks.cc PairRows)
  std::vector<float> dx, dx4, sx;  // [m, nb], [m, nb, 4], [m, nb]
  // rows8 layout: [n/8, nb, 4 chunks, 8 rows, 4 bytes]; d8, m8 [n/8, nb, 8]
  std::vector<uint8_t> qs8;
  std::vector<uint16_t> d8, m8;
};

static Problem Make(int64_t n, int64_t k, int64_t m) {
  Problem p{n, k, k / 32, m};
  srand(1);
  p.qs.resize(n * p.nb * 16);
  for (auto& b : p.qs) b = rand() & 0xFF;
  p.d.resize(n * p.nb); p.mn.resize(n * p.nb);
  for (auto& v : p.d) v = F2H(0.01f * (1 + rand() % 100) / 100.f);
  for (auto& v : p.mn) v = F2H(-0.05f * (rand() % 100) / 100.f);
  p.qx.resize(m * k); p.qxp.resize(m * k);
  for (auto& v : p.qx) v = (int8_t)(rand() % 255 - 127);
  p.dx.resize(m * p.nb); p.sx.resize(m * p.nb); p.dx4.resize(m * p.nb * 4);
  for (int64_t i = 0; i < m * p.nb; ++i) { p.dx[i] = 0.003f * (1 + rand() % 100); p.sx[i] = (rand() % 200 - 100) * 0.1f; }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b + 2 <= p.nb; b += 2)
      for (int half = 0; half < 2; ++half)
        for (int blk = 0; blk < 2; ++blk)
          memcpy(&p.qxp[(i * p.nb + b) * 32 + (2 * half + blk) * 16], &p.qx[(i * p.nb + b + blk) * 32 + 16 * half], 16);
    for (int64_t c = 0; c < p.nb; ++c) for (int j = 0; j < 4; ++j) p.dx4[(i * p.nb + c) * 4 + j] = p.dx[i * p.nb + c];
  }
  p.qs8.resize(n * p.nb * 16); p.d8.resize(n * p.nb); p.m8.resize(n * p.nb);
  for (int64_t g = 0; g < n / 8; ++g)
    for (int64_t b = 0; b < p.nb; ++b) {
      for (int c = 0; c < 4; ++c)
        for (int r = 0; r < 8; ++r)
          memcpy(&p.qs8[(((g * p.nb + b) * 4 + c) * 8 + r) * 4], &p.qs[((g * 8 + r) * p.nb + b) * 16 + 4 * c], 4);
      for (int r = 0; r < 8; ++r) {
        p.d8[(g * p.nb + b) * 8 + r] = p.d[(g * 8 + r) * p.nb + b];
        p.m8[(g * p.nb + b) * 8 + r] = p.mn[(g * 8 + r) * p.nb + b];
      }
    }
  return p;
}

static void Reference(const Problem& p, std::vector<double>& y) {
  y.assign(p.m * p.n, 0.0);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t r = 0; r < p.n; ++r) {
      double t = 0;
      for (int64_t b = 0; b < p.nb; ++b) {
        int32_t dot = 0;
        for (int j = 0; j < 32; ++j) {
          const uint8_t q = p.qs[(r * p.nb + b) * 16 + (j & 15)];
          dot += (j < 16 ? (q & 15) : (q >> 4)) * p.qx[(i * p.nb + b) * 32 + j];
        }
        t += (double)H2F(p.d[r * p.nb + b]) * p.dx[i * p.nb + b] * dot + (double)H2F(p.mn[r * p.nb + b]) * p.sx[i * p.nb + b];
      }
      y[i * p.n + r] = t;
    }
}

static inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- pairs: cpu_blocks.cc's q4_1 Tile (R = 4 W rows, MB rows of x), nb % 8 == 0 part + pairs tail
template <int MB, bool kChained>
__attribute__((noinline)) void Pairs(const Problem& p, float* y, int64_t n, int64_t m0) {
  constexpr int R = 4;
  const int64_t nb = p.nb;
  const uint8_t* qs = p.qs.data(); const uint16_t* d = p.d.data();
  const int8_t* qxp = p.qxp.data(); const float* dx = p.dx.data(); const float* dx4 = p.dx4.data();
  __m256 acc[MB][R];
  for (int i = 0; i < MB; ++i) for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i lane = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256 xd8[MB];
    for (int i = 0; i < MB; ++i) xd8[i] = _mm256_loadu_ps(dx + (m0 + i) * nb + b);
    for (int r = 0; r < R; ++r) {
      const int64_t row = n + r;
      const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(d + row * nb + b)));
      __m256 dwx[MB];
      for (int i = 0; i < MB; ++i) dwx[i] = _mm256_mul_ps(dd, xd8[i]);
      for (int q = 0; q < 4; ++q) {
        const __m256i spread = _mm256_add_epi32(_mm256_srli_epi32(lane, 2), _mm256_set1_epi32(2 * q));
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(qs + (row * nb + b + 2 * q) * 16));
        const __m256i lo = _mm256_and_si256(raw, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        for (int i = 0; i < MB; ++i) {
          const int8_t* px = qxp + ((m0 + i) * nb + b + 2 * q) * 32;
          const __m256i xlo = _mm256_loadu_si256((const __m256i*)px);
          const __m256i xhi = _mm256_loadu_si256((const __m256i*)(px + 32));
          __m256i dot;
          if (kChained) dot = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo), hi, xhi);
          else dot = _mm256_add_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo),
                                      _mm256_dpbusd_epi32(_mm256_setzero_si256(), hi, xhi));
          acc[i][r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dwx[i], spread), _mm256_cvtepi32_ps(dot), acc[i][r]);
        }
      }
    }
  }
  const __m256i spread = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
  for (; b + 2 <= nb; b += 2) {
    __m256i xlo[MB], xhi[MB]; __m256 xd[MB];
    for (int i = 0; i < MB; ++i) {
      const int8_t* px = qxp + ((m0 + i) * nb + b) * 32;
      xlo[i] = _mm256_loadu_si256((const __m256i*)px); xhi[i] = _mm256_loadu_si256((const __m256i*)(px + 32));
      xd[i] = _mm256_loadu_ps(dx4 + ((m0 + i) * nb + b) * 4);
    }
    for (int r = 0; r < R; ++r) {
      const int64_t row = n + r;
      const __m256i raw = _mm256_loadu_si256((const __m256i*)(qs + (row * nb + b) * 16));
      const __m256i lo = _mm256_and_si256(raw, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      uint32_t halves; memcpy(&halves, d + row * nb + b, 4);
      const __m128 dpair = _mm_cvtph_ps(_mm_cvtsi32_si128((int)halves));
      const __m256 dw = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dpair), spread);
      for (int i = 0; i < MB; ++i) {
        const __m256i dot = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo[i]), hi, xhi[i]);
        acc[i][r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, xd[i]), _mm256_cvtepi32_ps(dot), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int r = 0; r < R; ++r) {
      float total = Sum8(acc[i][r]);
      const uint16_t* wr = p.mn.data() + (n + r) * nb;
      const float* xs = p.sx.data() + (m0 + i) * nb;
      __m256 bias = _mm256_setzero_ps();
      int64_t c = 0;
      for (; c + 8 <= nb; c += 8)
        bias = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(wr + c))), _mm256_loadu_ps(xs + c), bias);
      total += Sum8(bias);
      for (; c < nb; ++c) total += H2F(wr[c]) * xs[c];
      y[(m0 + i) * p.n + n + r] = total;
    }
}

// ---- rows8: G groups of 8 W rows, MB rows of x; one block at a time
template <int MB, int G>
__attribute__((noinline)) void Rows8(const Problem& p, float* y, int64_t g0, int64_t m0) {
  const int64_t nb = p.nb;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[MB][G];
  for (int i = 0; i < MB; ++i) for (int g = 0; g < G; ++g) acc[i][g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int g = 0; g < G; ++g) {
      const int64_t gb = (g0 + g) * nb + b;
      const uint8_t* w = p.qs8.data() + gb * 128;
      __m256i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(w + 32 * c));
        lo[c] = _mm256_and_si256(raw, low4);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
      const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.d8.data() + gb * 8)));
      const __m256 mm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.m8.data() + gb * 8)));
      for (int i = 0; i < MB; ++i) {
        const int8_t* xq = p.qx.data() + ((m0 + i) * nb + b) * 32;
        int32_t xw[8];
        memcpy(xw, xq, 32);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          s0 = _mm256_dpbusd_epi32(s0, lo[c], _mm256_set1_epi32(xw[c]));
          s1 = _mm256_dpbusd_epi32(s1, hi[c], _mm256_set1_epi32(xw[4 + c]));
        }
        const __m256 scale = _mm256_mul_ps(dd, _mm256_set1_ps(p.dx[(m0 + i) * nb + b]));
        acc[i][g] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc[i][g]);
        acc[i][g] = _mm256_fmadd_ps(mm, _mm256_set1_ps(p.sx[(m0 + i) * nb + b]), acc[i][g]);
      }
    }
  }
  // 8 W rows' sums per vector: scatter to y (transposed store)
  for (int i = 0; i < MB; ++i)
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(y + (m0 + i) * p.n + (g0 + g) * 8, acc[i][g]);
}

template <int MB> void RunPairs(const Problem& p, float* y, bool chained, int64_t m0) {
  for (int64_t n = 0; n < p.n; n += 4) chained ? Pairs<MB, true>(p, y, n, m0) : Pairs<MB, false>(p, y, n, m0);
}
template <int MB> void RunRows8(const Problem& p, float* y, int64_t m0) {
  for (int64_t g = 0; g + 2 <= p.n / 8; g += 2) Rows8<MB, 2>(p, y, g, m0);
}

// All m rows of x in tiles of up to 4 (as the kernel dispatches)
static void Product(const Problem& p, float* y, int variant) {
  int64_t m0 = 0;
  auto one = [&](int mb) {
    switch (variant * 10 + mb) {
      case 1: RunPairs<1>(p, y, true, m0); break; case 2: RunPairs<2>(p, y, true, m0); break;
      case 3: RunPairs<3>(p, y, true, m0); break; case 4: RunPairs<4>(p, y, true, m0); break;
      case 11: RunPairs<1>(p, y, false, m0); break; case 12: RunPairs<2>(p, y, false, m0); break;
      case 13: RunPairs<3>(p, y, false, m0); break; case 14: RunPairs<4>(p, y, false, m0); break;
      case 21: RunRows8<1>(p, y, m0); break; case 22: RunRows8<2>(p, y, m0); break;
      case 23: RunRows8<3>(p, y, m0); break; case 24: RunRows8<4>(p, y, m0); break;
    }
  };
  for (; m0 + 4 <= p.m; m0 += 4) one(4);
  if (p.m - m0) one(int(p.m - m0));
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? atoll(argv[1]) : 1536, k = argc > 2 ? atoll(argv[2]) : 576;
  const char* names[] = {"pairs (kernel)", "pairs2 (dots unchained)", "rows8 (interleaved)"};
  printf("q4_1 W [%ld x %ld] (%.0f KB), one thread, weights hot in L2; ns per (block, W row, x row), median of 9\n",
         (long)n, (long)k, n * k / 32 * 20 / 1024.0);
  for (int64_t m : {1, 2, 3, 4, 5, 8, 9}) {
    Problem p = Make(n, k, m);
    std::vector<double> ref; Reference(p, ref);
    printf("rows %ld:", (long)m);
    double base = 0;
    for (int v = 0; v < 3; ++v) {
      std::vector<float> y(m * n);
      Product(p, y.data(), v);
      double err = 0;
      for (int64_t i = 0; i < m * n; ++i) err = std::max(err, std::fabs(y[i] - ref[i]) / (1e-3 + std::fabs(ref[i])));
      if (err > 1e-3) { printf("\n%s: WRONG (max rel err %g)\n", names[v], err); return 1; }
      std::vector<double> ts;
      const int reps = 200;
      for (int t = 0; t < 9; ++t) {
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) Product(p, y.data(), v);
        ts.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / reps);
      }
      std::sort(ts.begin(), ts.end());
      const double ns = ts[4] / (double(p.nb) * n * m);
      if (v == 0) base = ns;
      printf("  %s %.3f ns (%.2fx)", names[v], ns, base / ns);
    }
    printf("\n");
  }
}
