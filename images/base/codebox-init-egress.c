/*
 * codebox-init: the egress relay. A container codebox gives a way out (an install step, or a
 * program under `sandbox.egress_hosts`) still has `network_mode=none`: its only way out is
 * codebox's egress proxy, listening on a Unix socket the host mounts into the container. When
 * the environment holds CODEBOX_EGRESS=<IPv4>:<port>=<socket path>, codebox-init listens on
 * that TCP address (the container's loopback) and copies each connection to a new connection
 * on the Unix socket, both ways: each direction until its end of file, passed on as a
 * shutdown; an error on either side closes both. The variable is removed from the
 * environment the program gets.
 *
 * The relay is a thread of PID 1 with every signal blocked: it never writes to stdout (frames
 * are the main thread's), never exits the process, keeps no process of its own (kill(-1) and
 * the reaping of codebox-init-phase.c never see it) and ends with the container. It is not a
 * security boundary: the proxy on the host decides what is reached. All its descriptors are
 * close-on-exec; at most EGRESS_CONNS connections are relayed at once (more wait in the
 * listen backlog).
 */
#include "codebox-init.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#define EGRESS_CONNS 64
#define EGRESS_BUF 16384

/* Bytes read from one side, waiting to be written to the other. */
struct half {
    char buf[EGRESS_BUF];
    size_t len, off;
    int eof;  /* the source side said end of file */
    int done; /* ... and everything before it was passed on, then the shutdown */
};

struct conn {
    int tcp, uds; /* -1: the slot is free */
    struct half up, down; /* up: tcp -> uds; down: uds -> tcp */
};

struct egress {
    int listen_fd;
    struct sockaddr_un target;
    struct conn conns[EGRESS_CONNS];
};

static struct egress relay_state;

/* Parse "<IPv4>:<port>=<absolute path>". Returns -1 with err_text. */
static int egress_parse(const char *v, struct sockaddr_in *in, struct sockaddr_un *un)
{
    const char *eq = strchr(v, '='), *colon;
    char host[INET_ADDRSTRLEN];
    uint64_t port;
    if (!eq)
        return fail("`%.200s` is not <address>:<port>=<socket path>", v);
    colon = memrchr(v, ':', (size_t)(eq - v));
    if (!colon || (size_t)(colon - v) >= sizeof host)
        return fail("`%.200s` does not start with <IPv4 address>:<port>", v);
    memcpy(host, v, (size_t)(colon - v));
    host[colon - v] = 0;
    memset(in, 0, sizeof *in);
    in->sin_family = AF_INET;
    if (inet_pton(AF_INET, host, &in->sin_addr) != 1)
        return fail("`%.60s` is not an IPv4 address", host);
    if (parse_u64(colon + 1, (size_t)(eq - colon - 1), &port) < 0 || port > 65535)
        return fail("the port of `%.200s` is not a number up to 65535", v);
    in->sin_port = htons((uint16_t)port);
    memset(un, 0, sizeof *un);
    un->sun_family = AF_UNIX;
    if (eq[1] != '/' || strlen(eq + 1) >= sizeof un->sun_path)
        return fail("the socket path of `%.200s` is not absolute or longer than %zu bytes", v,
                    sizeof un->sun_path - 1);
    strcpy(un->sun_path, eq + 1);
    return 0;
}

static void conn_close(struct conn *c)
{
    close(c->tcp);
    close(c->uds);
    c->tcp = c->uds = -1;
}

/* A new connection from the container: its twin on the Unix socket, or closed at once when
 * the proxy cannot be reached (the client sees the connection end). */
static void conn_open(struct egress *e, int tcp)
{
    struct conn *c = NULL;
    for (int i = 0; i < EGRESS_CONNS && !c; i++)
        if (e->conns[i].tcp < 0)
            c = &e->conns[i];
    /* A blocking connect, for at most 5 s: a proxy whose listen backlog is full is waited
     * for, not taken for gone. */
    int uds = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval limit = { .tv_sec = 5 };
    if (!c || uds < 0 || setsockopt(uds, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) < 0 ||
        connect(uds, (const struct sockaddr *)&e->target, sizeof e->target) < 0 ||
        fcntl(uds, F_SETFL, O_NONBLOCK) < 0) {
        if (uds >= 0)
            close(uds);
        close(tcp);
        return;
    }
    memset(c, 0, sizeof *c);
    c->tcp = tcp;
    c->uds = uds;
}

/* Move what can move in one direction. Returns -1 when the connection is to be closed. */
static int half_step(struct half *h, int from, int to, short rev_from, short rev_to)
{
    if (!h->eof && h->len == 0 && (rev_from & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t n = recv(from, h->buf, sizeof h->buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        if (n < 0)
            return -1;
        if (n == 0)
            h->eof = 1;
        h->len = (size_t)n, h->off = 0;
    }
    if (h->len > 0 && (rev_to & (POLLOUT | POLLHUP | POLLERR))) {
        ssize_t n = send(to, h->buf + h->off, h->len, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        if (n < 0)
            return -1;
        h->off += (size_t)n, h->len -= (size_t)n;
    }
    if (h->eof && h->len == 0 && !h->done) {
        h->done = 1;
        shutdown(to, SHUT_WR);
    }
    return 0;
}

/* The events a side waits for: to read when its buffer is empty, to write when the other
 * direction has bytes for it. */
static short want(const struct half *read_into, const struct half *write_from)
{
    return (short)((!read_into->eof && read_into->len == 0 ? POLLIN : 0) |
                   (write_from->len > 0 ? POLLOUT : 0));
}

static void *egress_loop(void *arg)
{
    struct egress *e = arg;
    static struct pollfd p[1 + 2 * EGRESS_CONNS];
    int slot[1 + 2 * EGRESS_CONNS];
    for (;;) {
        nfds_t n = 0;
        int used = 0;
        for (int i = 0; i < EGRESS_CONNS; i++) {
            struct conn *c = &e->conns[i];
            if (c->tcp < 0)
                continue;
            used++;
            /* A side with nothing to wait for is left out: poll would report its hang-up
             * again and again. */
            short et = want(&c->up, &c->down), eu = want(&c->down, &c->up);
            p[n] = (struct pollfd){ .fd = et ? c->tcp : -1, .events = et };
            slot[n++] = i;
            p[n] = (struct pollfd){ .fd = eu ? c->uds : -1, .events = eu };
            slot[n++] = i;
        }
        p[n] = (struct pollfd){ .fd = used < EGRESS_CONNS ? e->listen_fd : -1,
                                .events = POLLIN };
        slot[n++] = -1;
        if (poll(p, n, -1) < 0)
            continue; /* EINTR: no signal is unblocked here, but be safe */
        for (nfds_t k = 0; k + 1 < n; k += 2) {
            struct conn *c = &e->conns[slot[k]];
            short rt = p[k].revents, ru = p[k + 1].revents;
            if (!rt && !ru)
                continue;
            if (half_step(&c->up, c->tcp, c->uds, rt, ru) < 0 ||
                half_step(&c->down, c->uds, c->tcp, ru, rt) < 0 ||
                (c->up.done && c->down.done))
                conn_close(c);
        }
        if (p[n - 1].revents & POLLIN) {
            int tcp = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (tcp >= 0)
                conn_open(e, tcp);
        }
    }
    return NULL;
}

/* Listen on `in` and start the relay thread. Returns -1 with err_text. */
static int egress_listen(struct egress *e, const struct sockaddr_in *in,
                         const struct sockaddr_un *un, uint16_t *port)
{
    int one = 1;
    e->target = *un;
    for (int i = 0; i < EGRESS_CONNS; i++)
        e->conns[i].tcp = e->conns[i].uds = -1;
    e->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (e->listen_fd < 0)
        return fail("cannot make a socket: %s", strerror(errno));
    setsockopt(e->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in bound;
    socklen_t blen = sizeof bound;
    char addr[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &in->sin_addr, addr, sizeof addr);
    if (bind(e->listen_fd, (const struct sockaddr *)in, sizeof *in) < 0 ||
        listen(e->listen_fd, 128) < 0 ||
        getsockname(e->listen_fd, (struct sockaddr *)&bound, &blen) < 0) {
        int err = errno;
        close(e->listen_fd);
        return fail("cannot listen on %s:%u: %s", addr, ntohs(in->sin_port), strerror(err));
    }
    if (port)
        *port = ntohs(bound.sin_port);
    /* The thread starts with every signal blocked: SIGCHLD and SIGTERM stay the main
     * thread's, taken in its ppoll. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &attr, egress_loop, e);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        close(e->listen_fd);
        return fail("cannot start the relay thread: %s", strerror(rc));
    }
    return 0;
}

int egress_start(void)
{
    const char *v = getenv(EGRESS_ENV);
    struct sockaddr_in in;
    struct sockaddr_un un;
    if (!v)
        return 0;
    if (egress_parse(v, &in, &un) < 0 || egress_listen(&relay_state, &in, &un, NULL) < 0)
        return -1;
    unsetenv(EGRESS_ENV);
    return 0;
}

/* ---- self-test ---- */

/* Wait up to 5 s for `events` on fd. */
static int wait_fd(int fd, short events)
{
    struct pollfd p = { .fd = fd, .events = events };
    return poll(&p, 1, 5000) == 1 ? 0 : -1;
}

/* The far side of the self-test: accept one connection on the Unix socket, echo it until end
 * of file, then write "bye" and close. */
static void echo_server(int ls)
{
    int s = accept(ls, NULL, NULL);
    char buf[4096];
    ssize_t n;
    if (s < 0)
        _exit(1);
    while ((n = read(s, buf, sizeof buf)) > 0)
        if (write_full(s, buf, (size_t)n) < 0)
            _exit(1);
    _exit(n == 0 && write_full(s, "bye", 3) == 0 ? 0 : 1);
}

/* 1 MiB through the relay and back, then a half-close: what the far side writes after the
 * client's end of file still arrives. */
static int relay_round_trip(uint16_t port)
{
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (c < 0 || connect(c, (struct sockaddr *)&to, sizeof to) < 0)
        return -1;
    fcntl(c, F_SETFL, O_NONBLOCK);
    size_t total = 1 << 20, sent = 0, got = 0;
    unsigned char out[8192], in[8192], expect = 0;
    int shut = 0;
    while (1) {
        struct pollfd p = { .fd = c, .events = (short)(POLLIN | (sent < total ? POLLOUT : 0)) };
        if (poll(&p, 1, 5000) != 1)
            return -1;
        if (p.revents & POLLOUT) {
            size_t k = total - sent < sizeof out ? total - sent : sizeof out;
            for (size_t i = 0; i < k; i++)
                out[i] = (unsigned char)((sent + i) * 7);
            ssize_t n = send(c, out, k, MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN)
                return -1;
            sent += n > 0 ? (size_t)n : 0;
        }
        if (sent == total && !shut)
            shut = 1, shutdown(c, SHUT_WR);
        if (p.revents & (POLLIN | POLLHUP)) {
            ssize_t n = recv(c, in, sizeof in, 0);
            if (n < 0 && errno == EAGAIN)
                continue;
            if (n <= 0)
                break;
            for (ssize_t i = 0; i < n; i++, got++) {
                if (got >= total + 3)
                    return -1;
                expect = got < total ? (unsigned char)(got * 7) : (unsigned char)"bye"[got - total];
                if (in[i] != expect)
                    return -1;
            }
        }
    }
    close(c);
    return got == total + 3 ? 0 : -1;
}

int egress_selftest(void)
{
    struct sockaddr_in in;
    struct sockaddr_un un;
    const char *bad[] = { "", "127.0.0.1:3128", "127.0.0.1=/x", "localhost:1=/x",
                          "127.0.0.1:65536=/x", "127.0.0.1:x=/x", "127.0.0.1:1=x",
                          "127.0.0.1:1=" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (egress_parse(bad[i], &in, &un) == 0) {
            fprintf(stderr, "selftest: egress value `%s` was accepted\n", bad[i]);
            return 1;
        }
    if (egress_parse("127.0.0.1:3128=/run/codebox-egress/proxy.sock", &in, &un) < 0 ||
        ntohs(in.sin_port) != 3128 || strcmp(un.sun_path, "/run/codebox-egress/proxy.sock")) {
        fprintf(stderr, "selftest: a good egress value was refused: %s\n", err_text);
        return 1;
    }

    char dir[] = "/tmp/codebox-egress-XXXXXX", path[64];
    if (!mkdtemp(dir))
        return perror("selftest: mkdtemp"), 1;
    snprintf(path, sizeof path, "%s/proxy.sock", dir);
    char value[128];
    snprintf(value, sizeof value, "127.0.0.1:0=%s", path);
    int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    uint16_t port = 0;
    int ok = ls >= 0 && egress_parse(value, &in, &un) == 0 &&
             bind(ls, (struct sockaddr *)&un, sizeof un) == 0 && listen(ls, 8) == 0 &&
             egress_listen(&relay_state, &in, &un, &port) == 0;
    pid_t server = ok ? fork() : -1;
    if (server == 0)
        echo_server(ls);
    int st = 1;
    ok = ok && server > 0 && relay_round_trip(port) == 0;
    if (server > 0)
        waitpid(server, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    /* The proxy gone: a new connection is ended at once, and the relay goes on. */
    unlink(path);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    char b;
    ok = ok && c >= 0 && connect(c, (struct sockaddr *)&to, sizeof to) == 0 &&
         wait_fd(c, POLLIN) == 0 && recv(c, &b, 1, 0) <= 0;
    if (c >= 0)
        close(c);
    if (ls >= 0)
        close(ls);
    rmdir(dir);
    if (!ok) {
        fprintf(stderr, "selftest: the egress relay failed its round trip%s%s\n",
                err_text[0] ? ": " : "", err_text);
        return 1;
    }
    puts("codebox-init: egress selftest passed");
    return 0;
}
