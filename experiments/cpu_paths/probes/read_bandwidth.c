// Read bandwidth by buffer size, on one and on two threads (each its own buffer): 512-bit
// loads summed into eight accumulators, each buffer swept until 4 GiB are read. L1, L2, the
// last-level cache and memory show as steps (BENCHMARKS.md, issue 29, fifth session).
//   gcc -O3 -mavx512f -pthread read_bandwidth.c -o /tmp/read_bw && /tmp/read_bw
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
volatile float sink;
typedef struct {float* buf; long n; long reps;} job;
static float sweep(const float* b, long n){
  __m512 a0=_mm512_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
  for(long i=0;i<n;i+=128){
    a0=_mm512_add_ps(a0,_mm512_load_ps(b+i)); a1=_mm512_add_ps(a1,_mm512_load_ps(b+i+16));
    a2=_mm512_add_ps(a2,_mm512_load_ps(b+i+32)); a3=_mm512_add_ps(a3,_mm512_load_ps(b+i+48));
    a4=_mm512_add_ps(a4,_mm512_load_ps(b+i+64)); a5=_mm512_add_ps(a5,_mm512_load_ps(b+i+80));
    a6=_mm512_add_ps(a6,_mm512_load_ps(b+i+96)); a7=_mm512_add_ps(a7,_mm512_load_ps(b+i+112));}
  a0=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3)),_mm512_add_ps(_mm512_add_ps(a4,a5),_mm512_add_ps(a6,a7)));
  return _mm512_reduce_add_ps(a0);}
void* run(void* p){job* j=p; float s=0; for(long r=0;r<j->reps;r++) s+=sweep(j->buf,j->n); sink=s; return 0;}
int main(){
  long sizes[]={16<<10, 256<<10, 1<<20, 1536<<10, 8<<20, 64<<20, 512<<20};
  for(int t=1;t<=2;t++) for(int s=0;s<7;s++){
    long bytes=sizes[s], n=bytes/4; long reps = (4L<<30)/bytes; if(reps<4) reps=4;
    job j[2]; pthread_t th[2];
    for(int k=0;k<t;k++){ j[k].buf=aligned_alloc(64,bytes); for(long i=0;i<n;i++) j[k].buf[i]=1e-9f*i; j[k].n=n; j[k].reps=reps; }
    double t0=now(); for(int k=0;k<t;k++) pthread_create(&th[k],0,run,&j[k]); for(int k=0;k<t;k++) pthread_join(th[k],0);
    double dt=now()-t0;
    printf("threads %d  %8ld KB each: %6.1f GB/s total\n", t, bytes>>10, t*bytes*(double)reps/dt/1e9);
    for(int k=0;k<t;k++) free(j[k].buf);
  }
}
