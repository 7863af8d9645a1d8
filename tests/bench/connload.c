/* The data-plane benchmark's two ends, in C so that the client and server cost microseconds
 * and what is measured is the path between them (a Python client spends more per connection
 * than the kernel's NAT does).
 *
 *   connload serve PORT
 *       accept a connection, read its request, answer "ok\n", wait for the client to close,
 *       close; forever (the benchmark kills it with its namespace's processes).
 *   connload load ADDRESS PORT SECONDS MAX
 *       new TCP connections one after another, each carrying one request and its answer,
 *       for SECONDS or MAX connections, whichever comes first (bounded); prints one JSON line:
 *       connections, errors, seconds, and the p50 and p99 of a connection's time from
 *       connect() to the answer, in microseconds. Stops early after 100 errors.
 *
 * The client ends each connection with a reset (SO_LINGER 0) once it has the answer, so no
 * side keeps a TIME_WAIT socket: a port reused seconds later would otherwise meet the
 * server's TIME_WAIT, whose timestamp check refuses a SYN from a connection with another
 * random timestamp offset, and cost a retransmission (seen as 1 s outliers and errors).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int address(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len) {
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    memset(ss, 0, sizeof(*ss));
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(port);
        *len = sizeof(*a4);
        return AF_INET;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(port);
        *len = sizeof(*a6);
        return AF_INET6;
    }
    return -1;
}

static int serve(int port) {
    int one = 1;
    int fd = socket(AF_INET6, SOCK_STREAM, 0); /* dual-stack: v4-mapped too */
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port),
                             .sin6_addr = IN6ADDR_ANY_INIT};
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 4096)) {
        perror("connload serve");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        char buf[256];
        int c = accept(fd, NULL, NULL);
        if (c < 0)
            continue;
        struct timeval tv = {.tv_sec = 1};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* a client gone quiet */
        if (recv(c, buf, sizeof(buf), 0) > 0 && send(c, "ok\n", 3, MSG_NOSIGNAL) == 3)
            while (recv(c, buf, sizeof(buf), 0) > 0)
                ;
        close(c);
    }
}

static int load(const char *host, int port, double seconds, long max) {
    struct sockaddr_storage ss;
    socklen_t len;
    int family = address(host, port, &ss, &len);
    if (family < 0) {
        fprintf(stderr, "connload: not an address: %s\n", host);
        return 2;
    }
    double *lat = malloc(sizeof(double) * max);
    long n = 0, errors = 0;
    struct timeval tv = {.tv_sec = 1};
    struct linger reset = {.l_onoff = 1, .l_linger = 0};
    double t0 = now(), end = t0 + seconds;
    while (n < max && errors < 100 && now() < end) {
        char buf[64];
        double t = now();
        int fd = socket(family, SOCK_STREAM, 0), got = 0, r;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* bounds connect() too */
        if (connect(fd, (struct sockaddr *)&ss, len) == 0 &&
            send(fd, "GET\n", 4, MSG_NOSIGNAL) == 4) {
            while (got < 3 && (r = recv(fd, buf, sizeof(buf), 0)) > 0)
                got += r;
        }
        double one = now() - t;
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
        close(fd);
        if (got == 3)
            lat[n++] = one * 1e6;
        else
            errors++;
    }
    double took = now() - t0;
    qsort(lat, n, sizeof(double), cmp);
    printf("{\"connections\": %ld, \"errors\": %ld, \"seconds\": %.3f, \"p50_us\": %.1f, "
           "\"p99_us\": %.1f}\n",
           n, errors, took, n ? lat[n / 2] : -1.0, n ? lat[(long)(n * 0.99)] : -1.0);
    free(lat);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "serve") == 0)
        return serve(atoi(argv[2]));
    if (argc == 6 && strcmp(argv[1], "load") == 0)
        return load(argv[2], atoi(argv[3]), atof(argv[4]), atol(argv[5]));
    fprintf(stderr, "usage: connload serve PORT | connload load ADDRESS PORT SECONDS MAX\n");
    return 2;
}
