/*
 * The system-call floor of a UDP ping-pong, in C: which calls a round trip
 * pays for, with nothing of skiff in the way. Two threads on CPU 1 send one
 * 8-byte datagram back and forth 100,000 times (after 1,000 of warm-up) and
 * print the p50 and p99 round trip. Results: bench/RESULTS.md, fourth session.
 *
 *   gcc -O2 -o pp bench/pingpong_floor.c -lpthread
 *   ./pp CONN NAME OVFL GRO TX RX [RAW]
 *
 * CONN 1: connect both sockets to each other.
 * NAME, OVFL, GRO 1: with RX 2, ask recvmsg for the source address; turn on
 *   SO_RXQ_OVFL; turn on UDP_GRO (both only matter with RX 2).
 * TX: 0 send (connected), 1 sendto, 2 sendmsg with the address, 3 sendmsg
 *   without one (connected).
 * RX: 0 recv, 1 recvfrom, 2 recvmsg (with a control buffer if OVFL or GRO).
 * RAW 1: send and recvfrom/recv through syscall(2), not glibc's wrappers.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum { TRIPS = 100000, WARMUP = 1000, BUF = 65536 };

static int conn, name, ovfl, gro, txm, rxm, raw;
static int sa, sb;
static struct sockaddr_in aa, ba;

static int make(struct sockaddr_in *out) {
    int s = socket(AF_INET, SOCK_DGRAM, 0), one = 1, size = 4 << 20;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof *out;
    bind(s, (void *)&a, sizeof a);
    getsockname(s, (void *)out, &len);
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    if (ovfl) setsockopt(s, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof one);
    if (gro) setsockopt(s, SOL_UDP, UDP_GRO, &one, sizeof one);
    return s;
}

static void tx(int s, struct sockaddr_in *to, char *b, int n) {
    if (raw) {
        syscall(SYS_sendto, s, b, n, 0, txm == 0 ? NULL : to, txm == 0 ? 0 : sizeof *to);
    } else if (txm == 0) {
        send(s, b, n, 0);
    } else if (txm == 1) {
        sendto(s, b, n, 0, (void *)to, sizeof *to);
    } else {
        struct iovec iov = {b, n};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (txm == 2) {
            m.msg_name = to;
            m.msg_namelen = sizeof *to;
        }
        sendmsg(s, &m, 0);
    }
}

static int rx(int s, char *b) {
    struct sockaddr_storage from;
    socklen_t len = sizeof from;
    if (raw)
        return syscall(SYS_recvfrom, s, b, BUF, 0, rxm == 0 ? NULL : &from, rxm == 0 ? NULL : &len);
    if (rxm == 0) return recv(s, b, BUF, 0);
    if (rxm == 1) return recvfrom(s, b, BUF, 0, (void *)&from, &len);
    char ctrl[128];
    struct iovec iov = {b, BUF};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (name) {
        m.msg_name = &from;
        m.msg_namelen = sizeof from;
    }
    if (ovfl || gro) {
        m.msg_control = ctrl;
        m.msg_controllen = sizeof ctrl;
    }
    return recvmsg(s, &m, 0);
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static void *echo(void *unused) {
    static char b[BUF];
    (void)unused;
    pin(1);
    for (;;) {
        int n = rx(sb, b);
        if (n >= 0) tx(sb, &aa, b, n);
    }
    return NULL;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s CONN NAME OVFL GRO TX RX [RAW]\n", argv[0]);
        return 2;
    }
    conn = atoi(argv[1]), name = atoi(argv[2]), ovfl = atoi(argv[3]), gro = atoi(argv[4]);
    txm = atoi(argv[5]), rxm = atoi(argv[6]), raw = argc > 7 ? atoi(argv[7]) : 0;
    if ((txm == 0 || txm == 3) && !conn) {
        fprintf(stderr, "TX %d needs CONN 1\n", txm);
        return 2;
    }
    sa = make(&aa);
    sb = make(&ba);
    if (conn) {
        connect(sa, (void *)&ba, sizeof ba);
        connect(sb, (void *)&aa, sizeof aa);
    }
    pthread_t t;
    pthread_create(&t, NULL, echo, NULL);
    pin(1);
    static char b[BUF];
    char ping[8] = {0};
    double *lat = malloc(TRIPS * sizeof *lat);
    for (int i = 0; i < WARMUP; i++) {
        tx(sa, &ba, ping, sizeof ping);
        rx(sa, b);
    }
    for (int i = 0; i < TRIPS; i++) {
        double t0 = now_us();
        tx(sa, &ba, ping, sizeof ping);
        rx(sa, b);
        lat[i] = now_us() - t0;
    }
    qsort(lat, TRIPS, sizeof *lat, cmp);
    printf("conn=%d name=%d ovfl=%d gro=%d tx=%d rx=%d raw=%d p50 %.2f us p99 %.2f us\n", conn, name, ovfl,
           gro, txm, rxm, raw, lat[TRIPS / 2], lat[TRIPS * 99 / 100]);
    return 0;
}
