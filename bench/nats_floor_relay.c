/*
 * nats_floor_relay: the least a NATS server can do for bench/nats/natsbench's
 * rows, to measure the floor of a row's rate on this machine: how fast
 * the load generator runs against a server that costs almost nothing.
 *
 * One thread, one epoll loop (as skiff's node with one worker), plain
 * NATS core only: INFO, CONNECT, PING/PONG, SUB (a queue group is taken
 * as a plain subscription), UNSUB, PUB with or without a reply subject,
 * MSG out. Subjects match with `*` and `>`. What a client's read routes
 * to other clients is written to them at the end of that read ("flush on
 * the producer's read loop", as nats-server does), with no hand-off to
 * another task; what a socket does not take waits for EPOLLOUT, and
 * while more than 8 MiB waits the loop reads nothing (flow control). No
 * limits, no authentication, no slow-consumer handling, no headers: a
 * measuring tool for loopback benchmarks, never a server.
 *
 *   cc -O2 -pthread -o nats_floor_relay bench/nats_floor_relay.c
 *   nats_floor_relay PORT          # on 127.0.0.1:PORT, one thread
 *   nats_floor_relay PORT threads  # a thread per connection (blocking
 *                                  # reads, as nats-server's goroutines),
 *                                  # routing and writing under one lock
 *   nats_floor_relay PORT spin     # one thread that polls (epoll_wait
 *                                  # without sleeping) up to 100 us after
 *                                  # traffic before it sleeps, as skiff's
 *                                  # node does (`spin_us`)
 *   nats_floor_relay PORT batch    # one thread that writes once per
 *                                  # epoll_wait, after every ready read
 *
 * Run by bench/nats_cost.py as server `floor` (bench/RESULTS.md, session 28).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define MAXFD 4096
#define INBUF (1 << 20)
#define MAXSUBS 4096

struct conn {
    int open;
    char *in;
    size_t in_len;
    char *out;
    /* Pending output: out[out_off..out_len]. */
    size_t out_off, out_len, out_cap;
    int dirty;
    /* Registered for EPOLLOUT: the socket took only part of it. */
    int want_out;
};

struct sub {
    int fd;
    char sid[64];
    char subj[256];
    /* The last `MSG` line without a reply sent for it, and its subject
     * and size: the next one the same is copied, not formatted. */
    char hdr[400];
    int hdr_len;
    char hdr_subj[256];
    size_t hdr_subj_len, hdr_size;
};

static struct conn conns[MAXFD];
static struct sub subs[MAXSUBS];
static int nsubs;
static int dirty[MAXFD];
static int ndirty;
/* Threads mode: the subscriptions and every connection's output are
 * shared; one lock (held while routing and flushing a read's output). */
static int threaded, spin, batch;
static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;

/* Output pending in all connections; above OUT_LIMIT the loop stops
 * reading until the subscribers take it (flow control, as a server's). */
static size_t pending_total;
#define OUT_LIMIT (8u << 20)
static int ep_fd = -1;

static void out_put(int fd, const char *p, size_t n) {
    struct conn *c = &conns[fd];
    if (c->out_off > 0 && c->out_len + n > c->out_cap) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 65536;
        while (cap < c->out_len + n) cap *= 2;
        c->out = realloc(c->out, cap);
        if (!c->out) abort();
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    pending_total += n;
    if (!c->dirty) {
        c->dirty = 1;
        dirty[ndirty++] = fd;
    }
}

static void want_out(int fd, int on) {
    struct conn *c = &conns[fd];
    if (threaded || c->want_out == on) return;
    struct epoll_event e = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.fd = fd};
    epoll_ctl(ep_fd, EPOLL_CTL_MOD, fd, &e);
    c->want_out = on;
}

/* Writes what fd's socket takes of its pending output (all of it on a
 * blocking socket); the rest waits for EPOLLOUT. */
static void flush_fd(int fd) {
    struct conn *c = &conns[fd];
    while (c->out_off < c->out_len) {
        ssize_t n = send(fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            pending_total -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            want_out(fd, 1);
            return;
        } else {
            break; /* closed: dropped (a measuring tool) */
        }
    }
    pending_total -= c->out_len - c->out_off;
    c->out_off = c->out_len = 0;
    want_out(fd, 0);
}

/* Flow control: while too much is pending, waits for the sockets that
 * hold it to take some, reading nothing meanwhile. */
static void drain_backlog(void) {
    static struct pollfd ps[MAXFD];
    while (pending_total > OUT_LIMIT) {
        int k = 0;
        for (int fd = 0; fd < MAXFD; fd++)
            if (conns[fd].open && conns[fd].out_off < conns[fd].out_len)
                ps[k++] = (struct pollfd){.fd = fd, .events = POLLOUT};
        if (k == 0 || poll(ps, (nfds_t)k, 1000) <= 0) return;
        for (int i = 0; i < k; i++)
            if (ps[i].revents) flush_fd(ps[i].fd);
    }
}

static void flush_all(void) {
    /* (A connection is listed once: `dirty` is cleared only here.) */
    for (int i = 0; i < ndirty; i++) {
        conns[dirty[i]].dirty = 0;
        flush_fd(dirty[i]);
    }
    ndirty = 0;
}

/* Whether subject (len n) matches pattern (NUL-terminated): tokens split
 * on '.', `*` one token, `>` the rest. */
static int matches(const char *pat, const char *s, size_t n) {
    const char *end = s + n;
    while (1) {
        const char *pe = strchr(pat, '.');
        size_t pl = pe ? (size_t)(pe - pat) : strlen(pat);
        const char *se = memchr(s, '.', (size_t)(end - s));
        size_t sl = se ? (size_t)(se - s) : (size_t)(end - s);
        if (pl == 1 && pat[0] == '>') return 1;
        if (!(pl == 1 && pat[0] == '*') && (pl != sl || memcmp(pat, s, pl) != 0)) return 0;
        if (!pe && !se) return 1;
        if (!pe || !se) return 0;
        pat = pe + 1;
        s = se + 1;
    }
}

/* Splits line (len n) at spaces into at most max args; count. */
static int split(char *line, size_t n, char **args, size_t *lens, int max) {
    int k = 0;
    size_t i = 0;
    while (i < n && k < max) {
        while (i < n && (line[i] == ' ' || line[i] == '\t')) i++;
        if (i >= n) break;
        args[k] = line + i;
        while (i < n && line[i] != ' ' && line[i] != '\t') i++;
        lens[k] = (size_t)(line + i - args[k]);
        k++;
    }
    return k;
}

static void close_conn(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    conns[fd].open = 0;
    conns[fd].in_len = 0;
    pending_total -= conns[fd].out_len - conns[fd].out_off;
    conns[fd].out_off = conns[fd].out_len = 0;
    conns[fd].want_out = 0;
    for (int i = 0; i < nsubs;) {
        if (subs[i].fd == fd) subs[i] = subs[--nsubs];
        else i++;
    }
}

/* Handles every whole operation in fd's input; -1: close it. */
static int handle(int fd) {
    struct conn *c = &conns[fd];
    char *p = c->in, *end = c->in + c->in_len;
    char hdr[1024];
    while (p < end) {
        char *nl = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (!nl) break;
        size_t ll = (size_t)(nl - p);
        char *args[5];
        size_t lens[5];
        if (ll >= 4 && strncasecmp(p, "PUB ", 4) == 0) {
            int k = split(p + 4, ll - 4, args, lens, 4);
            if (k < 2 || k > 3) return -1;
            size_t size = strtoul(args[k - 1], NULL, 10);
            if ((size_t)(end - (nl + 2)) < size + 2) break; /* payload not here yet */
            char *payload = nl + 2;
            for (int i = 0; i < nsubs; i++) {
                if (!matches(subs[i].subj, args[0], lens[0])) continue;
                struct sub *sb = &subs[i];
                int h;
                if (k == 2 && sb->hdr_len > 0 && sb->hdr_size == size && sb->hdr_subj_len == lens[0] &&
                    memcmp(sb->hdr_subj, args[0], lens[0]) == 0) {
                    out_put(sb->fd, sb->hdr, (size_t)sb->hdr_len);
                    out_put(sb->fd, payload, size + 2);
                    continue;
                }
                if (k == 3)
                    h = snprintf(hdr, sizeof hdr, "MSG %.*s %s %.*s %zu\r\n", (int)lens[0], args[0],
                                 sb->sid, (int)lens[1], args[1], size);
                else
                    h = snprintf(hdr, sizeof hdr, "MSG %.*s %s %zu\r\n", (int)lens[0], args[0],
                                 sb->sid, size);
                if (h <= 0 || (size_t)h >= sizeof hdr) return -1;
                if (k == 2 && (size_t)h <= sizeof sb->hdr && lens[0] <= sizeof sb->hdr_subj) {
                    memcpy(sb->hdr, hdr, (size_t)h);
                    sb->hdr_len = h;
                    memcpy(sb->hdr_subj, args[0], lens[0]);
                    sb->hdr_subj_len = lens[0];
                    sb->hdr_size = size;
                }
                out_put(sb->fd, hdr, (size_t)h);
                out_put(subs[i].fd, payload, size + 2);
            }
            p = payload + size + 2;
            continue;
        }
        if (ll >= 4 && strncasecmp(p, "SUB ", 4) == 0) {
            int k = split(p + 4, ll - 4, args, lens, 4);
            if (k < 2 || k > 3 || nsubs >= MAXSUBS) return -1;
            if (lens[0] >= sizeof subs[0].subj || lens[k - 1] >= sizeof subs[0].sid) return -1;
            struct sub *s = &subs[nsubs++];
            s->fd = fd;
            s->hdr_len = 0;
            memcpy(s->subj, args[0], lens[0]);
            s->subj[lens[0]] = 0;
            memcpy(s->sid, args[k - 1], lens[k - 1]);
            s->sid[lens[k - 1]] = 0;
        } else if (ll >= 6 && strncasecmp(p, "UNSUB ", 6) == 0) {
            int k = split(p + 6, ll - 6, args, lens, 3);
            if (k == 1) {
                for (int i = 0; i < nsubs; i++) {
                    if (subs[i].fd == fd && strlen(subs[i].sid) == lens[0] &&
                        memcmp(subs[i].sid, args[0], lens[0]) == 0) {
                        subs[i] = subs[--nsubs];
                        break;
                    }
                }
            }
        } else if (ll >= 4 && strncasecmp(p, "PING", 4) == 0) {
            out_put(fd, "PONG\r\n", 6);
        }
        /* CONNECT, PONG, +OK, -ERR: nothing to do. */
        p = nl + 2;
    }
    size_t left = (size_t)(end - p);
    memmove(c->in, p, left);
    c->in_len = left;
    return c->in_len == INBUF ? -1 : 0;
}

/* Threads mode: one connection's reader; what a read routes is written
 * by this thread before the next read. */
static void *conn_thread(void *arg) {
    int fd = (int)(long)arg;
    struct conn *c = &conns[fd];
    for (;;) {
        ssize_t r = recv(fd, c->in + c->in_len, INBUF - c->in_len, 0);
        if (r <= 0 && !(r < 0 && errno == EINTR)) break;
        if (r < 0) continue;
        c->in_len += (size_t)r;
        pthread_mutex_lock(&big);
        int bad = handle(fd) < 0;
        flush_all();
        pthread_mutex_unlock(&big);
        if (bad) break;
    }
    pthread_mutex_lock(&big);
    for (int i = 0; i < nsubs;) {
        if (subs[i].fd == fd) subs[i] = subs[--nsubs];
        else i++;
    }
    conns[fd].open = 0;
    pthread_mutex_unlock(&big);
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: floor_relay PORT [threads]\n");
        return 2;
    }
    threaded = argc > 2 && strcmp(argv[2], "threads") == 0;
    spin = argc > 2 && strcmp(argv[2], "spin") == 0;
    batch = argc > 2 && strcmp(argv[2], "batch") == 0;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 128)) {
        perror("listen");
        return 1;
    }
    int ep = epoll_create1(0);
    ep_fd = ep;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    static const char info[] = "INFO {\"server_id\":\"FLOOR\",\"version\":\"2.11.0\",\"proto\":1,"
                               "\"headers\":false,\"max_payload\":1048576}\r\n";
    struct epoll_event evs[256];
    struct timespec last = {0};
    for (;;) {
        int n = epoll_wait(ep, evs, 256, spin ? 0 : -1);
        if (spin) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (n > 0) {
                last = now;
            } else if ((now.tv_sec - last.tv_sec) * 1000000000L + (now.tv_nsec - last.tv_nsec) >
                       100000L) {
                n = epoll_wait(ep, evs, 256, -1);
                clock_gettime(CLOCK_MONOTONIC, &last);
            } else {
                sched_yield();
                continue;
            }
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == l) {
                int c;
                while ((c = accept4(l, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (c >= MAXFD) {
                        close(c);
                        continue;
                    }
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    if (!conns[c].in) conns[c].in = malloc(INBUF);
                    if (threaded) {
                        /* Blocking; a thread of its own. */
                        fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK);
                        pthread_mutex_lock(&big);
                        conns[c].open = 1;
                        conns[c].in_len = 0;
                        out_put(c, info, sizeof info - 1);
                        flush_all();
                        pthread_mutex_unlock(&big);
                        pthread_t t;
                        pthread_create(&t, NULL, conn_thread, (void *)(long)c);
                        pthread_detach(t);
                        continue;
                    }
                    conns[c].open = 1;
                    conns[c].in_len = 0;
                    struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
                    out_put(c, info, sizeof info - 1);
                }
                continue;
            }
            struct conn *c = &conns[fd];
            if (!c->open) continue;
            if (evs[i].events & EPOLLOUT) flush_fd(fd);
            if (!(evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
            ssize_t r = recv(fd, c->in + c->in_len, INBUF - c->in_len, 0);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                close_conn(ep, fd);
                continue;
            }
            if (r > 0) {
                c->in_len += (size_t)r;
                if (handle(fd) < 0) close_conn(ep, fd);
            }
            /* The producer's read loop flushes what its read routed. */
            if (!batch) flush_all();
            drain_backlog();
        }
        flush_all();
        drain_backlog();
    }
}
