// Does a core overlap its FMAs with its weight stream? Each thread sweeps its own 256 MB;
// per 512 bytes loaded, F FMAs that consume them. Time against F, 1 and 2 threads, with an
// optional software prefetch PD bytes ahead (hint 0: T0, 1: T1, 2: T2). Issue 29, eighth
// session (experiments/cpu_paths/results/prefetch_ab_xeon.txt).
//   gcc -O3 -mavx512f -mfma -pthread overlap.c -o /tmp/overlap && /tmp/overlap 256 [PD] [HINT]
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
volatile float sink;
typedef struct {float* buf; long n; int f;} job; long PD=0; int HINT=0;
#define FMAS(F) for(int q=0;q<(F)/8;q++){ \
  c0=_mm512_fmadd_ps(c0,s,a0);c1=_mm512_fmadd_ps(c1,s,a1);c2=_mm512_fmadd_ps(c2,s,a2);c3=_mm512_fmadd_ps(c3,s,a3); \
  c4=_mm512_fmadd_ps(c4,s,a4);c5=_mm512_fmadd_ps(c5,s,a5);c6=_mm512_fmadd_ps(c6,s,a6);c7=_mm512_fmadd_ps(c7,s,a7);}
static float sweep(const float* b, long n, int F){
  __m512 a0=_mm512_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
  __m512 c0=a0,c1=a0,c2=a0,c3=a0,c4=a0,c5=a0,c6=a0,c7=a0, s=_mm512_set1_ps(0.999f);
  for(long i=0;i<n;i+=128){
    if(PD){ const char* p=(const char*)(b+i)+PD; for(int l=0;l<512;l+=64){ if(HINT==0)_mm_prefetch(p+l,_MM_HINT_T0); else if(HINT==1)_mm_prefetch(p+l,_MM_HINT_T1); else _mm_prefetch(p+l,_MM_HINT_T2);} }
    a0=_mm512_load_ps(b+i); a1=_mm512_load_ps(b+i+16);
    a2=_mm512_load_ps(b+i+32); a3=_mm512_load_ps(b+i+48);
    a4=_mm512_load_ps(b+i+64); a5=_mm512_load_ps(b+i+80);
    a6=_mm512_load_ps(b+i+96); a7=_mm512_load_ps(b+i+112);
    switch(F){case 0: c0=_mm512_add_ps(c0,a0);c1=_mm512_add_ps(c1,a1);c2=_mm512_add_ps(c2,a2);c3=_mm512_add_ps(c3,a3);
      c4=_mm512_add_ps(c4,a4);c5=_mm512_add_ps(c5,a5);c6=_mm512_add_ps(c6,a6);c7=_mm512_add_ps(c7,a7);break;
     case 16: FMAS(16) break; case 32: FMAS(32) break; case 64: FMAS(64) break; case 128: FMAS(128) break; case 256: FMAS(256) break;}
  }
  c0=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0,c1),_mm512_add_ps(c2,c3)),_mm512_add_ps(_mm512_add_ps(c4,c5),_mm512_add_ps(c6,c7)));
  return _mm512_reduce_add_ps(c0);}
void* run(void* p){job* j=p; sink=sweep(j->buf,j->n,j->f); return 0;}
int main(int argc,char**argv){
  long bytes=(argc>1?atol(argv[1]):256)<<20; PD=argc>2?atol(argv[2]):0; HINT=argc>3?atoi(argv[3]):0; long n=bytes/4; int Fs[]={0,16,32,64,128,256};
  for(int t=1;t<=2;t++){ job j[2]; pthread_t th[2];
    for(int k=0;k<t;k++){ j[k].buf=aligned_alloc(64,bytes); for(long i=0;i<n;i++) j[k].buf[i]=1e-9f*(i&1023); j[k].n=n;}
    for(int fi=0;fi<6;fi++){ double best=1e9; for(int rep=0;rep<3;rep++){
      for(int k=0;k<t;k++) j[k].f=Fs[fi];
      double t0=now(); for(int k=0;k<t;k++) pthread_create(&th[k],0,run,&j[k]); for(int k=0;k<t;k++) pthread_join(th[k],0);
      double dt=now()-t0; if(dt<best) best=dt;}
      double iters=n/128.0, fma_ns = Fs[fi]/7.5;
      printf("threads %d F=%3d per 512B: %6.1f GB/s total, %5.1f ns/iter (compute alone ~%4.1f ns)\n", t, Fs[fi], t*bytes/best/1e9, best/iters*1e9, fma_ns);}
    for(int k=0;k<t;k++) free(j[k].buf);}
}
