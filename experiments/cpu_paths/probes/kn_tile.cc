// The kn kernel's register tile (specjax/kernels/cpu_linear.cc KnTile) alone, on one thread,
// over weights that stay in L2: how fast each tile shape (rows of x by 512-bit vectors of
// columns) runs when nothing but the tile is timed. -DREG forces the weights into
// registers (GCC folds them into the FMAs' memory operands for small tiles); -DPACKED
// reads each stretch of columns contiguously instead of one row of w after another
// (a prototype of a packed layout; timing only, the sums are of the wrong weights).
//   g++ -O3 -mavx512f -mavx512vl -mfma [-DREG] [-DPACKED] kn_tile.cc -o /tmp/kn_tile
//   /tmp/kn_tile 576 576   # K N: w[K, N]; also 72 576 (one part of the kernel's eight)
// Outputs on the Xeon of BENCHMARKS.md: experiments/cpu_paths/results/kn_tiles_xeon.txt.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstdint>
using Vec = __m512; constexpr int kLanes = 16;
template <int MB, int JB>
__attribute__((noinline)) void KnTile(const float* x, const float* w, float* part, int64_t k_dim, int64_t n_dim,
                   int64_t k0, int64_t k1, int64_t m0, int64_t j, const float* next) {
  Vec acc[MB][JB];
  for (int i = 0; i < MB; ++i) for (int b = 0; b < JB; ++b) acc[i][b] = _mm512_setzero_ps();
  for (int64_t k = k0; k < k1; ++k) {
#ifdef PACKED
    const float* wk = w + (j / (JB * kLanes)) * k_dim * (JB * kLanes) + k * (JB * kLanes);
#else
    const float* wk = w + k * n_dim + j;
#endif
    if (next != nullptr)
      for (int b = 0; b < JB * kLanes; b += 16)
        _mm_prefetch(reinterpret_cast<const char*>(next + k * n_dim + b), _MM_HINT_T0);
    Vec v[JB];
    for (int b = 0; b < JB; ++b) { v[b] = _mm512_loadu_ps(wk + b * kLanes);
#ifdef REG
      asm volatile("" : "+v"(v[b]));
#endif
 }
    for (int i = 0; i < MB; ++i) {
      const Vec xv = _mm512_set1_ps(x[(m0 + i) * k_dim + k]);
      for (int b = 0; b < JB; ++b) acc[i][b] = _mm512_fmadd_ps(xv, v[b], acc[i][b]);
    }
  }
  for (int i = 0; i < MB; ++i) for (int b = 0; b < JB; ++b) _mm512_storeu_ps(part + (m0 + i) * n_dim + j + b * kLanes, acc[i][b]);
}
int main(int argc, char** argv) {
  const int64_t K = atoi(argv[1]), N = atoi(argv[2]);
  std::vector<float> x(12 * K, 0.5f), w(K * N, 0.25f), part(12 * N);
  auto run = [&](auto tile, const char* name, int fmas, int64_t step) {
    double best = 1e9;
    for (int rep = 0; rep < 20; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < 20; ++it)
        for (int64_t j = 0; j + step <= N; j += step) tile(x.data(), w.data(), part.data(), K, N, 0, K, 0, j, j + step < N ? w.data() + j + step : nullptr);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 20;
      if (s < best) best = s;
    }
    double iters = double(K) * (N / step);
    printf("%s K=%ld N=%ld: %.1f us, %.2f ns/k-iter, %.2f G fma/s, full-coverage us %.1f\n", name, K, N, best * 1e6, best / iters * 1e9, iters * fmas / best / 1e9, best*1e6*N/(double(N/step)*step));
  };
  run(KnTile<1, 4>, "1x4", 4, 64); run(KnTile<3, 4>, "3x4", 12, 64); run(KnTile<6, 4>, "6x4", 24, 64); run(KnTile<9, 2>, "9x2", 18, 32); run(KnTile<9, 3>, "9x3", 27, 48); run(KnTile<8, 3>, "8x3", 24, 48); run(KnTile<6,3>, "6x3", 18, 48);
}
