// A single-thread model of the copies of an shm publish at 1->1 (issue 21):
// payload -> the publisher's run (64 KiB, reused), run -> ring A (the
// client's ring, S bytes), ring A -> ring B (the topic's ring, S bytes,
// one copy per message as the node makes), then one byte per line of B
// read (the in-place reader). Prints ns per message, to see what the
// rings' size costs in the caches alone (this VM exposes no cache-miss
// counters to perf):
//
//   cc -O2 -o /tmp/rcm bench/ring_cache_model.c
//   for s in 262144 1048576 4194304 16777216; do taskset -c 1 /tmp/rcm $s 256 20000000; done
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  if (argc < 4) { fprintf(stderr, "usage: %s RING_BYTES MSG_BYTES MESSAGES\n", argv[0]); return 2; }
  size_t S=strtoul(argv[1],0,0), msg=strtoul(argv[2],0,0); long n=strtol(argv[3],0,0);
  char *run=aligned_alloc(4096,65536), *A=aligned_alloc(4096,S), *B=aligned_alloc(4096,S);
  char payload[4096]; memset(payload,7,sizeof payload); memset(A,0,S); memset(B,0,S); memset(run,0,65536);
  size_t rec=msg+12; rec=(rec+7)&~7ul; size_t per_run=65536/rec;
  size_t pa=0,pb=0; volatile uint64_t sum=0;
  double t0=now();
  for(long i=0;i<n;i+=per_run){
    for(size_t k=0;k<per_run;k++){ memcpy(run+k*rec+12,payload,msg); *(uint32_t*)(run+k*rec)=msg; }
    size_t len=per_run*rec;
    if (pa + len > S)
      pa = 0;
    memcpy(A + pa, run, len);
    // node: per message copy A->B
    for(size_t k=0;k<per_run;k++){ if(pb+rec>S) pb=0; memcpy(B+pb,A+pa+k*rec,rec); pb+=rec; }
    pa+=len;
    // reader: touch every message of B just written
    size_t q = pb>=len? pb-len:0; uint64_t s=0; for(size_t k=q;k<pb;k+=64) s+=B[k]; sum+=s;
  }
  double t=now()-t0; printf("S=%zu msg=%zu %.1f ns/msg\n",S,msg,t*1e9/n); return 0; }
