// How many vector FMAs a core of this CPU retires per second, 512-bit and 256-bit, on one
// and on two threads: twelve independent chains in registers, nothing read from memory.
// The kernels' row tiles are compared against it (BENCHMARKS.md, issue 29, fifth session).
//   gcc -O3 -mavx512f -mfma -mavx2 -pthread fma_rate.c -o /tmp/fma_rate && /tmp/fma_rate
// (-O3: at -O2 GCC keeps the twelve accumulators in memory and the rate falls 3.5x.)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define N 200000000L
__attribute__((noinline)) float z512(long n){
  __m512 a[12]; for(int i=0;i<12;i++)a[i]=_mm512_set1_ps(i*0.001f);
  __m512 b=_mm512_set1_ps(0.9999f), c=_mm512_set1_ps(0.0001f);
  for(long k=0;k<n;k++){ for(int i=0;i<12;i++) a[i]=_mm512_fmadd_ps(a[i],b,c);}
  __m512 s=a[0]; for(int i=1;i<12;i++) s=_mm512_add_ps(s,a[i]); return _mm512_reduce_add_ps(s);}
__attribute__((noinline)) float z256(long n){
  __m256 a[12]; for(int i=0;i<12;i++)a[i]=_mm256_set1_ps(i*0.001f);
  __m256 b=_mm256_set1_ps(0.9999f), c=_mm256_set1_ps(0.0001f);
  for(long k=0;k<n;k++){ for(int i=0;i<12;i++) a[i]=_mm256_fmadd_ps(a[i],b,c);}
  __m256 s=a[0]; for(int i=1;i<12;i++) s=_mm256_add_ps(s,a[i]); float o[8]; _mm256_storeu_ps(o,s); return o[0];}
volatile float sink;
void* th(void*p){ long w=(long)p; if(w) sink=z512(N/12); else sink=z256(N/12); return 0;}
int main(){
  for(int rep=0;rep<2;rep++){
  double t=now(); unsigned long long c0=__rdtsc(); float r=z512(N/12); unsigned long long c1=__rdtsc(); double dt=now()-t;
  printf("zmm 1 thread: %.2f G FMA/s, %.2f tsc-cycles/FMA (%f)\n", N/dt/1e9, (c1-c0)/(double)N, r);
  t=now(); c0=__rdtsc(); r=z256(N/12); c1=__rdtsc(); dt=now()-t;
  printf("ymm 1 thread: %.2f G FMA/s, %.2f tsc-cycles/FMA (%f)\n", N/dt/1e9, (c1-c0)/(double)N, r);
  pthread_t a,b; t=now(); pthread_create(&a,0,th,(void*)1); pthread_create(&b,0,th,(void*)1); pthread_join(a,0); pthread_join(b,0); dt=now()-t;
  printf("zmm 2 threads: %.2f G FMA/s total\n", 2*N/dt/1e9);
  t=now(); pthread_create(&a,0,th,(void*)0); pthread_create(&b,0,th,(void*)0); pthread_join(a,0); pthread_join(b,0); dt=now()-t;
  printf("ymm 2 threads: %.2f G FMA/s total\n", 2*N/dt/1e9);
  }
}
