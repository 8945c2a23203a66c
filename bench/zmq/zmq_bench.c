/*
 * zmq_bench: the ZeroMQ baseline of `skiff bench queue`.
 *
 * PUSH/PULL over TCP on 127.0.0.1 with libzmq from Debian. A sender thread
 * PUSHes MESSAGES messages of SIZE bytes (or as many as fit in
 * DURATION_SECS), then one empty message as an end marker; the main thread
 * PULLs them. The clock starts when the sender starts sending and stops at
 * the last data message received, the same rule skiff's own rows use.
 *
 * Prints one JSON line in the `skiff bench` row schema:
 *   {"test":"zmq","mode":"push-pull-tcp","size":..,"messages":..,
 *    "msgs_per_s":..,"mb_per_s":..,"p50_us":null,"p99_us":null,
 *    "lost":0,"cpu_pct":..,"elapsed_s":..,"options":"..."}
 *
 * usage: zmq_bench SIZE MESSAGES [DURATION_SECS [IO_THREADS [CONTEXTS [TRANSPORT]]]]
 *   IO_THREADS  libzmq I/O threads per context (default 1)
 *   CONTEXTS    1: both sockets share one context (default);
 *               2: one context each, as two processes would have
 *   TRANSPORT   tcp (default): PUSH/PULL over tcp://127.0.0.1;
 *               ipc: PUSH/PULL over ipc:// (a Unix socket), test "zmq-ipc";
 *               ipc-pingpong: MESSAGES round trips of SIZE bytes between
 *               two PAIR sockets over ipc://, test "zmq-ipc-pingpong",
 *               with p50_us/p99_us (used by `skiff bench shm`).
 *
 * Build: bench/zmq/build.sh (installs libzmq3-dev and gcc if missing).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

struct sender_args {
    void *ctx;
    char endpoint[256];
    size_t size;
    uint64_t messages;
    double duration;
    uint64_t sent;
    struct timespec start;
    int error;
    int done; /* set (atomically) once the sender has closed its socket */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double ts_s(struct timespec t) { return (double)t.tv_sec + (double)t.tv_nsec / 1e9; }

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec / 1e6;
}

static void die(const char *what) {
    fprintf(stderr, "zmq_bench: %s: %s\n", what, zmq_strerror(zmq_errno()));
    exit(1);
}

static void *sender(void *p) {
    struct sender_args *a = p;
    void *push = zmq_socket(a->ctx, ZMQ_PUSH);
    if (!push || zmq_connect(push, a->endpoint) != 0) {
        a->error = zmq_errno();
        return NULL;
    }
    /* Close delivers what is queued, but waits no longer than 5 s. */
    int linger_ms = 5000;
    zmq_setsockopt(push, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    char *buf = malloc(a->size ? a->size : 1);
    memset(buf, 0xA5, a->size);
    clock_gettime(CLOCK_MONOTONIC, &a->start);
    double deadline = ts_s(a->start) + a->duration;
    uint64_t n = 0;
    while (n < a->messages) {
        if (zmq_send(push, buf, a->size, 0) < 0) {
            if (zmq_errno() == EINTR) continue;
            a->error = zmq_errno();
            break;
        }
        n++;
        if ((n & 1023) == 0 && now_s() >= deadline) break;
    }
    a->sent = n;
    /* The end marker: an empty message. */
    while (zmq_send(push, "", 0, 0) < 0 && zmq_errno() == EINTR) {
    }
    free(buf);
    zmq_close(push);
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct echo_args {
    void *ctx;
    char endpoint[256];
    size_t size;
    int error;
};

static void *echo(void *p) {
    struct echo_args *a = p;
    void *pair = zmq_socket(a->ctx, ZMQ_PAIR);
    if (!pair || zmq_connect(pair, a->endpoint) != 0) {
        a->error = zmq_errno();
        return NULL;
    }
    char *buf = malloc(a->size + 1);
    for (;;) {
        int n = zmq_recv(pair, buf, a->size + 1, 0);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            a->error = zmq_errno();
            break;
        }
        if (n == 0) break;
        while (zmq_send(pair, buf, (size_t)n, 0) < 0 && zmq_errno() == EINTR) {
        }
    }
    free(buf);
    zmq_close(pair);
    return NULL;
}

/* MESSAGES round trips over ipc:// PAIR sockets; one JSON row. */
static int pingpong(size_t size, uint64_t messages, double duration, int io_threads) {
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_IO_THREADS, io_threads);
    void *pair = zmq_socket(ctx, ZMQ_PAIR);
    char ep[256];
    snprintf(ep, sizeof ep, "ipc:///tmp/zmq_bench_pp_%d.ipc", (int)getpid());
    if (!pair || zmq_bind(pair, ep) != 0) die("zmq_bind ipc");
    struct echo_args a;
    memset(&a, 0, sizeof a);
    a.ctx = ctx;
    a.size = size;
    snprintf(a.endpoint, sizeof a.endpoint, "%s", ep);
    pthread_t t;
    if (pthread_create(&t, NULL, echo, &a) != 0) {
        perror("pthread_create");
        return 1;
    }
    char *buf = malloc(size + 1);
    memset(buf, 0xA5, size);
    double *rtt = malloc(sizeof(double) * (messages ? messages : 1));
    uint64_t warm = messages < 1000 ? messages : 1000, n = 0;
    double cpu0 = cpu_s(), wall0 = now_s(), deadline = wall0 + duration;
    for (uint64_t i = 0; i < warm + messages; i++) {
        double t0 = now_s();
        if (zmq_send(pair, buf, size, 0) < 0) die("zmq_send");
        if (zmq_recv(pair, buf, size + 1, 0) < 0) die("zmq_recv");
        if (i >= warm) rtt[n++] = (now_s() - t0) * 1e6;
        if (now_s() >= deadline) break;
    }
    double wall = now_s() - wall0;
    double cpu_pct = (cpu_s() - cpu0) / wall * 100.0;
    zmq_send(pair, "", 0, 0);
    pthread_join(t, NULL);
    qsort(rtt, n, sizeof(double), cmp_double);
    double p50 = n ? rtt[n / 2] : 0, p99 = n ? rtt[(size_t)((double)n * 0.99)] : 0;
    printf("{\"test\":\"zmq-ipc-pingpong\",\"mode\":\"pair-ipc\",\"size\":%zu,\"messages\":%llu,"
           "\"msgs_per_s\":null,\"mb_per_s\":null,\"p50_us\":%.3f,\"p99_us\":%.3f,"
           "\"lost\":0,\"cpu_pct\":%.1f,\"elapsed_s\":%.6f,"
           "\"options\":\"%s io_threads=%d libzmq %d.%d.%d\"}\n",
           size, (unsigned long long)n, p50, p99, cpu_pct, wall, ep, io_threads, ZMQ_VERSION_MAJOR,
           ZMQ_VERSION_MINOR, ZMQ_VERSION_PATCH);
    free(rtt);
    free(buf);
    zmq_close(pair);
    zmq_ctx_term(ctx);
    unlink(ep + 6);
    return a.error ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SIZE MESSAGES [DURATION_SECS [IO_THREADS [CONTEXTS [TRANSPORT]]]]\n",
                argv[0]);
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10);
    uint64_t messages = strtoull(argv[2], NULL, 10);
    double duration = argc > 3 ? atof(argv[3]) : 1e9;
    int io_threads = argc > 4 ? atoi(argv[4]) : 1;
    int contexts = argc > 5 ? atoi(argv[5]) : 1;
    const char *transport = argc > 6 ? argv[6] : "tcp";
    int ipc = strcmp(transport, "ipc") == 0;
    if (!ipc && strcmp(transport, "tcp") != 0 && strcmp(transport, "ipc-pingpong") != 0) {
        fprintf(stderr, "zmq_bench: TRANSPORT must be tcp, ipc or ipc-pingpong\n");
        return 2;
    }
    if (strcmp(transport, "ipc-pingpong") == 0) return pingpong(size, messages, duration, io_threads);
    if (size == 0 || messages == 0 || duration <= 0 || io_threads < 1 || contexts < 1 || contexts > 2) {
        fprintf(stderr, "zmq_bench: SIZE and MESSAGES must be positive, CONTEXTS 1 or 2\n");
        return 2;
    }

    void *rctx = zmq_ctx_new();
    zmq_ctx_set(rctx, ZMQ_IO_THREADS, io_threads);
    void *sctx = rctx;
    if (contexts == 2) {
        sctx = zmq_ctx_new();
        zmq_ctx_set(sctx, ZMQ_IO_THREADS, io_threads);
    }
    void *pull = zmq_socket(rctx, ZMQ_PULL);
    if (!pull) die("zmq_socket");
    char ipc_ep[256];
    snprintf(ipc_ep, sizeof ipc_ep, "ipc:///tmp/zmq_bench_%d.ipc", (int)getpid());
    if (zmq_bind(pull, ipc ? ipc_ep : "tcp://127.0.0.1:*") != 0) die("zmq_bind");
    int hwm = 0;
    size_t hwm_len = sizeof hwm;
    zmq_getsockopt(pull, ZMQ_RCVHWM, &hwm, &hwm_len);

    struct sender_args a;
    memset(&a, 0, sizeof a);
    a.ctx = sctx;
    a.size = size;
    a.messages = messages;
    a.duration = duration;
    size_t ep_len = sizeof a.endpoint;
    if (zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, a.endpoint, &ep_len) != 0) die("ZMQ_LAST_ENDPOINT");

    char *buf = malloc(size + 1);
    double cpu0 = cpu_s(), wall0 = now_s();
    pthread_t t;
    if (pthread_create(&t, NULL, sender, &a) != 0) {
        perror("pthread_create");
        return 1;
    }
    uint64_t received = 0;
    struct timespec last = {0, 0};
    /* libzmq 4.3.4's ipc PUSH/PULL here now and then stalls before the end
       marker (seen with one context too): a receive that waits 2 s after
       the sender is done ends the run, and what never came is `lost`. */
    int timeout_ms = 2000;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    for (;;) {
        int n = zmq_recv(pull, buf, size + 1, 0);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            if (zmq_errno() == EAGAIN) {
                if (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE)) break;
                continue;
            }
            die("zmq_recv");
        }
        if (n == 0) break;
        received++;
        clock_gettime(CLOCK_MONOTONIC, &last); /* vDSO: tens of ns */
    }
    pthread_join(t, NULL);
    double cpu_pct = (cpu_s() - cpu0) / (now_s() - wall0) * 100.0;
    if (a.error) {
        fprintf(stderr, "zmq_bench: sender: %s\n", zmq_strerror(a.error));
        return 1;
    }
    double elapsed = ts_s(last) - ts_s(a.start);
    if (elapsed <= 0) elapsed = 1e-9;
    double rate = (double)received / elapsed;
    printf("{\"test\":\"%s\",\"mode\":\"push-pull-%s\",\"size\":%zu,\"messages\":%llu,"
           "\"msgs_per_s\":%.1f,\"mb_per_s\":%.3f,\"p50_us\":null,\"p99_us\":null,"
           "\"lost\":%llu,\"cpu_pct\":%.1f,\"elapsed_s\":%.6f,"
           "\"options\":\"%s hwm=%d io_threads=%d contexts=%d libzmq %d.%d.%d\"}\n",
           ipc ? "zmq-ipc" : "zmq", transport, size, (unsigned long long)a.sent, rate, rate * (double)size / 1e6, (unsigned long long)(a.sent - received),
           cpu_pct, elapsed, ipc ? ipc_ep : "tcp://127.0.0.1", hwm, io_threads, contexts, ZMQ_VERSION_MAJOR, ZMQ_VERSION_MINOR,
           ZMQ_VERSION_PATCH);
    free(buf);
    zmq_close(pull);
    if (sctx != rctx) zmq_ctx_term(sctx);
    zmq_ctx_term(rctx);
    if (ipc) unlink(ipc_ep + 6);
    return 0;
}
