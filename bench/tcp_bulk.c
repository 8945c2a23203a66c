// The CPU a plain TCP bulk copy costs, beside the tunnel's (bench/RESULTS.md,
// session 30): MiB (argument) in 64 KiB writes and reads over loopback,
// sender and receiver threads of one process. Run under perf stat:
//   cc -O2 -pthread -o /tmp/tcp_bulk bench/tcp_bulk.c
//   ip netns exec NS perf stat -e context-switches,task-clock /tmp/tcp_bulk 512
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/tcp.h>
#include <time.h>
#include <unistd.h>
static long total;
static int lfd;
static void *rx(void *a) {
  int c = accept(lfd, 0, 0);
  char *b = malloc(65536);
  long got = 0;
  for (;;) { ssize_t n = read(c, b, 65536); if (n <= 0) break; got += n; }
  printf("got %ld\n", got);
  return 0;
}
int main(int argc, char **argv) {
  total = atol(argv[1]) << 20;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(5999)};
  sa.sin_addr.s_addr = htonl(0x7f000001);
  lfd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1; setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  if (bind(lfd, (void *)&sa, sizeof sa) || listen(lfd, 1)) { perror("bind"); return 1; }
  pthread_t t; pthread_create(&t, 0, rx, 0);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, (void *)&sa, sizeof sa)) { perror("connect"); return 1; }
  static char buf[65536];
  memset(buf, 0xa5, sizeof buf);
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long sent = 0; sent < total; sent += 65536) if (write(s, buf, 65536) != 65536) { perror("write"); return 1; }
  close(s); pthread_join(t, 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("%.0f MB/s\n", total / secs / 1e6);
}
