// c2c: how long one cache line takes to go from CPU 0 to CPU 1 and back
// on this machine now (two threads pinned, a line bounced N times; one-way
// ns, min / median / max of 9 rounds, each with a fresh peer thread, so
// nothing spins between rounds). The shm rows move every message's lines
// between the two cores; on this VM that hand-off is not a constant of the
// machine (bench/RESULTS.md, session 29): run it next to a benchmark.
//
//   cc -O2 -pthread -o /tmp/c2c bench/c2c.c && /tmp/c2c 20000
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(128) _Atomic long flag;
static long n;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *peer(void *arg) {
    (void)arg;
    pin(1);
    for (long i = 0; i < n; i++) {
        while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 1) {
        }
        atomic_store_explicit(&flag, 2 * i + 2, memory_order_release);
    }
    return 0;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    n = argc > 1 ? atol(argv[1]) : 20000;
    double r[9];
    pin(0);
    for (int k = 0; k < 9; k++) {
        flag = 0;
        pthread_t t;
        pthread_create(&t, 0, peer, 0);
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            atomic_store_explicit(&flag, 2 * i + 1, memory_order_release);
            while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 2) {
            }
        }
        r[k] = (now_ns() - t0) / n / 2;
        pthread_join(t, 0);
    }
    qsort(r, 9, sizeof r[0], cmp);
    printf("c2c one-way ns: min %.0f median %.0f max %.0f\n", r[0], r[4], r[8]);
    return 0;
}
