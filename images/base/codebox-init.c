/*
 * codebox-init: PID 1 of every codebox sandbox container.
 *
 * It reads one payload of records on stdin (files, argv, limits), lays out the working
 * directory, runs the optional `check` and then the `run` command, relays their output as
 * frames on stdout, reports how each phase ended and what it used, sends back the files the
 * program left, and exits. The protocol and the behaviour are specified in
 * docs/sandbox-init.md; keep this file and that document in step.
 *
 * Build: gcc -std=c11 -static -O2 -Wall -Wextra -Werror -o codebox-init codebox-init.c
 * Self-test of the SHA-256 code: codebox-init --selftest
 *
 * Records the payload leaves out: no wall-clock limit (0 means none as well), output_limit
 * 1 MiB, collect none, max_files 32, max_file_bytes 4 MiB, max_bytes 8 MiB. A record other
 * than env, dir, file and link may appear once.
 *
 * Where the document leaves a choice: F paths are relative to the working directory
 * ("outputs/a.txt"), fields separated (not terminated) by NUL; each directory's entries are
 * sorted bytewise and walked depth first; a `dir` record may name an existing directory (its
 * mode is then set); peak_kb is the container's high-water mark since it started (the cgroup
 * cannot be reset without privileges); after `stopped`, no further phase runs and no files are
 * collected; as PID 1, only a SIGTERM sent from outside the container counts.
 *
 * Safety: kill(-1, SIGKILL) is called only when this process is PID 1, that is inside the
 * container's own PID namespace. Otherwise (tests, `docker run --init`) each phase's command
 * gets a process group of its own, and the helper kills that group and its own children (it is
 * a child subreaper, so orphans become its children).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 65536             /* largest O, E or B frame payload; read size */
#define MAX_PATH 4096           /* longest path or link target */
#define MAX_RECORD (1u << 20)   /* largest record kept in memory (all but a file's content) */
#define MAX_KEPT (8u << 20)     /* all records but files' content, in all */
#define MAX_DEPTH 16            /* levels listed below outputs/ or the working directory */
#define MAX_LISTED 1000         /* entries listed in `outputs` mode, folders included */
#define MAX_WORKSPACE 100000    /* entries in `workspace-on-success` mode */
#define MAX_COUNTED 1000000     /* entries counted, not listed, past MAX_LISTED */
#define STR_(x) #x
#define STR(x) STR_(x)
#ifndef X_BYTES                 /* an X frame's text (tests/init/check.sh builds it smaller) */
#define X_BYTES (MAX_PATH + 1024)
#endif

extern char **environ;

enum { C_NONE, C_OUTPUTS, C_WORKSPACE };

static struct {
    char **check, **run, **env;
    size_t nenv, kept;
    uint64_t check_timeout_ms, timeout_ms, output_limit, max_files, max_bytes, max_file_bytes;
    int collect;
} cfg = { .output_limit = 1 << 20, .max_files = 32, .max_bytes = 8 << 20,
          .max_file_bytes = 4 << 20 };

static int is_init, out_broken;
static volatile sig_atomic_t got_term;
static sigset_t wait_mask; /* the signal mask while waiting: SIGCHLD and SIGTERM let through */
static unsigned char iobuf[CHUNK];

/* ---- SHA-256 (FIPS 180-4) ---- */

struct sha256 { uint32_t h[8]; uint64_t len; unsigned char buf[64]; size_t n; };

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(struct sha256 *s, const unsigned char *p)
{
    uint32_t w[64], v[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, s->h, sizeof v);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = v[7] + (ROR(v[4], 6) ^ ROR(v[4], 11) ^ ROR(v[4], 25)) +
                      ((v[4] & v[5]) ^ (~v[4] & v[6])) + K[i] + w[i];
        uint32_t t2 = (ROR(v[0], 2) ^ ROR(v[0], 13) ^ ROR(v[0], 22)) +
                      ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof v[0]);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++)
        s->h[i] += v[i];
}

static void sha_init(struct sha256 *s)
{
    static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->n = 0;
}

static void sha_update(struct sha256 *s, const void *data, size_t len)
{
    const unsigned char *p = data;
    s->len += len;
    while (len > 0) {
        size_t k = 64 - s->n < len ? 64 - s->n : len;
        memcpy(s->buf + s->n, p, k);
        s->n += k, p += k, len -= k;
        if (s->n == 64) {
            sha_block(s, s->buf);
            s->n = 0;
        }
    }
}

static void sha_hex(struct sha256 *s, char out[65])
{
    uint64_t bits = s->len * 8;
    unsigned char pad[72] = { 0x80 };
    size_t padlen = (s->n < 56 ? 56 : 120) - s->n;
    for (int i = 0; i < 8; i++)
        pad[padlen + i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_update(s, pad, padlen + 8);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", (unsigned)(s->h[i / 4] >> (24 - 8 * (i % 4))) & 0xff);
}

static int selftest(void)
{
    static const char *const v[][2] = {
        { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
        { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
        { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
        { "a", "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0" }, /* 10^6 times */
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        struct sha256 s;
        char hex[65];
        sha_init(&s);
        for (int r = 0; r < (i == 3 ? 1000000 : 1); r++)
            sha_update(&s, v[i][0], strlen(v[i][0]));
        sha_hex(&s, hex);
        if (strcmp(hex, v[i][1]) != 0)
            bad = printf("sha256 test %zu: got %s, want %s\n", i, hex, v[i][1]);
    }
    puts(bad ? "codebox-init: selftest FAILED" : "codebox-init: selftest passed");
    return bad != 0;
}

/* ---- frames ---- */

static int write_full(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n, len -= (size_t)n;
    }
    return 0;
}

/* One frame on stdout. After a write error (EPIPE: the host went away) nothing more is
 * written, but the work goes on so that the program is still stopped and reaped. */
static void frame(char kind, const void *data, size_t len)
{
    unsigned char head[5] = { (unsigned char)kind, (unsigned char)(len >> 24),
                              (unsigned char)(len >> 16), (unsigned char)(len >> 8),
                              (unsigned char)len };
    if (out_broken)
        return;
    if (write_full(1, head, sizeof head) < 0 || (len > 0 && write_full(1, data, len) < 0))
        out_broken = 1;
}

static void vmessage(char kind, const char *fmt, va_list ap)
{
    char buf[2 * MAX_PATH + 256];
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    if (n < 0)
        n = 0;
    frame(kind, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

__attribute__((format(printf, 1, 2))) static void warnf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage('W', fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 1, 2), noreturn)) static void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage('!', fmt, ap);
    va_end(ap);
    exit(125);
}

/* Append a formatted piece to buf (capacity cap, *n bytes used), whole or not at all: a piece
 * that does not fit is left out rather than cut (a cut `key=value` line would be misread), and
 * *n never passes cap - 1. Returns -1 when the piece was left out. */
__attribute__((format(printf, 4, 5))) static int appendf(char *buf, size_t cap, size_t *n,
                                                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = *n < cap ? vsnprintf(buf + *n, cap - *n, fmt, ap) : -1;
    va_end(ap);
    if (k < 0 || (size_t)k >= cap - *n) {
        if (*n < cap)
            buf[*n] = 0;
        return -1;
    }
    *n += (size_t)k;
    return 0;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fatal("out of memory");
    return p;
}

/* ---- the payload ---- */

/* Stdin is read through a buffer, but never past the end record: what follows it is the
 * program's stdin, which the program reads from the same pipe. So a read asks only for what
 * the parser needs now, or more when the payload is known to hold more: after a record header,
 * its value and the shortest next header (`end 0\n`); in a partial header, the least that its
 * name and the digits so far imply (header_bound). A payload of n records takes about n reads. */
static struct {
    unsigned char buf[CHUNK];
    size_t pos, len;   /* unread bytes: buf[pos..len) */
    uint64_t off;      /* bytes read from stdin so far */
    uint64_t sure;     /* stdin offset up to which every byte belongs to the payload */
} in;

#define MIN_HEADER 6   /* `end 0\n`, the shortest record header */

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Stdin offset of the next unread byte. */
static uint64_t in_at(void)
{
    return in.off - (in.len - in.pos);
}

/* Make at least `need` (at most CHUNK) unread bytes available. Waits in ppoll, the only place
 * where SIGTERM is let through, so that a stop ends a wait for a payload that never comes; a
 * read follows only a ppoll that found input, so it never blocks with SIGTERM masked. */
static void in_need(size_t need)
{
    if (in.len - in.pos >= need)
        return;
    memmove(in.buf, in.buf + in.pos, in.len - in.pos);
    in.len -= in.pos;
    in.pos = 0;
    while (in.len < need) {
        size_t want = need - in.len, room = CHUNK - in.len;
        uint64_t sure = in.sure > in.off ? in.sure - in.off : 0;
        if (sure > want)
            want = sure < room ? (size_t)sure : room;
        struct pollfd p = { .fd = 0, .events = POLLIN };
        int r = ppoll(&p, 1, NULL, &wait_mask);
        if (got_term)
            fatal("stopped (SIGTERM) while reading the payload");
        if (r < 0 && errno != EINTR)
            fatal("payload: poll: %s", strerror(errno));
        if (r <= 0)
            continue;
        ssize_t n = read(0, in.buf + in.len, want);
        if (n == 0)
            fatal("payload: the input ended before the end record");
        if (n < 0 && errno != EINTR && errno != EAGAIN)
            fatal("payload: read: %s", strerror(errno));
        if (n > 0)
            in.len += (size_t)n, in.off += (uint64_t)n;
    }
}

/* Copy the next n bytes of the payload to dst. */
static void in_take(void *dst, size_t n)
{
    char *p = dst;
    while (n > 0) {
        in_need(1);
        size_t k = in.len - in.pos < n ? in.len - in.pos : n;
        memcpy(p, in.buf + in.pos, k);
        in.pos += k, p += k, n -= k;
    }
}

static int parse_u64(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 20)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9' || v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

static unsigned parse_mode(const char *s, size_t n, const char *rec)
{
    unsigned m = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '7' || m > 0777)
            fatal("payload: %s record: the mode is not an octal number up to 7777", rec);
        m = m * 8 + (unsigned)(s[i] - '0');
    }
    if (n == 0)
        fatal("payload: %s record: no mode", rec);
    return m;
}

/* A path relative to the working directory: no empty, `.` or `..` component. */
static void check_path(const char *p, size_t n, const char *rec)
{
    int bad = n == 0 || n > MAX_PATH || p[0] == '/' || memchr(p, 0, n) != NULL;
    for (size_t i = 0; !bad && i <= n;) {
        size_t j = i;
        while (j < n && p[j] != '/')
            j++;
        bad = j == i || (j - i == 1 && p[i] == '.') || (j - i == 2 && p[i] == '.' && p[i + 1] == '.');
        i = j + 1;
    }
    if (bad)
        fatal("payload: %s record: invalid path \"%.*s\" (relative, at most %d bytes, no empty, "
              "`.` or `..` component)", rec, (int)(n < 200 ? n : 200), p, MAX_PATH);
}

/* Open the directory that holds `path`, walking (and creating, 0755) its parents without
 * following symbolic links. Returns the fd and points *leaf at the last component. */
static int open_parent(char *path, const char **leaf)
{
    int dfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char *comp = path, *slash;
    if (dfd < 0)
        fatal("cannot open the working directory: %s", strerror(errno));
    while ((slash = strchr(comp, '/')) != NULL) {
        *slash = 0;
        int fd = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT && mkdirat(dfd, comp, 0755) == 0) {
            fd = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0 && fchmod(fd, 0755) < 0)
                fatal("payload: cannot chmod the directory %s: %s", path, strerror(errno));
        }
        if (fd < 0)
            fatal("payload: cannot open the directory %s: %s", path, strerror(errno));
        *slash = '/';
        close(dfd);
        dfd = fd;
        comp = slash + 1;
    }
    *leaf = comp;
    return dfd;
}

static void rec_dir(char *v, size_t len)
{
    char *sp = memchr(v, ' ', len);
    const char *leaf;
    if (!sp || strlen(v) != len)
        fatal("payload: a dir record is not `<mode> <path>`");
    unsigned mode = parse_mode(v, (size_t)(sp - v), "dir");
    char *path = sp + 1;
    check_path(path, strlen(path), "dir");
    int dfd = open_parent(path, &leaf);
    if (mkdirat(dfd, leaf, 0700) < 0 && errno != EEXIST)
        fatal("payload: cannot create the directory %s: %s", path, strerror(errno));
    int fd = openat(dfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fchmod(fd, mode) < 0)
        fatal("payload: cannot create the directory %s: %s", path, strerror(errno));
    close(fd);
    close(dfd);
}

static void rec_link(char *v, size_t len)
{
    char *nul = memchr(v, 0, len), *target;
    const char *leaf;
    if (!nul)
        fatal("payload: a link record is not `<path>\\0<target>`");
    target = nul + 1;
    size_t tlen = len - (size_t)(target - v);
    if (tlen == 0 || tlen > MAX_PATH || strlen(target) != tlen)
        fatal("payload: link record %s: the target is empty, too long or holds a NUL", v);
    check_path(v, (size_t)(nul - v), "link");
    int dfd = open_parent(v, &leaf);
    if (symlinkat(target, dfd, leaf) < 0)
        fatal("payload: cannot create the link %s: %s", v, strerror(errno));
    close(dfd);
}

/* A file record is streamed to its file: its content never sits in memory. */
static void rec_file(uint64_t len)
{
    char head[MAX_PATH + 16], *sp;
    const char *leaf;
    size_t m = len < sizeof head - 1 ? (size_t)len : sizeof head - 1, n;
    in_need(m);
    char *nul = memchr(in.buf + in.pos, 0, m);
    if (!nul)
        fatal("payload: a file record has no NUL within %zu bytes", m);
    n = (size_t)(nul - (char *)in.buf) - in.pos;
    memcpy(head, in.buf + in.pos, n + 1);
    in.pos += n + 1;
    if (!(sp = memchr(head, ' ', n)))
        fatal("payload: a file record is not `<mode> <path>\\0<content>`");
    unsigned mode = parse_mode(head, (size_t)(sp - head), "file");
    char *path = sp + 1;
    check_path(path, strlen(path), "file");
    int dfd = open_parent(path, &leaf);
    int fd = openat(dfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        fatal("payload: cannot create the file %s: %s", path, strerror(errno));
    for (uint64_t left = len - n - 1; left > 0;) {
        in_need(1);
        size_t k = in.len - in.pos < left ? in.len - in.pos : (size_t)left;
        if (write_full(fd, in.buf + in.pos, k) < 0)
            fatal("payload: cannot write the file %s: %s", path, strerror(errno));
        in.pos += k;
        left -= k;
    }
    if (fchmod(fd, mode) < 0)
        fatal("payload: cannot chmod the file %s: %s", path, strerror(errno));
    close(fd);
    close(dfd);
}

/* argv: each argument followed by a NUL byte. */
static char **parse_argv(char *v, size_t len, const char *rec)
{
    size_t argc = 0;
    if (len == 0 || v[len - 1] != 0 || v[0] == 0)
        fatal("payload: the %s record is not a list of NUL-terminated arguments", rec);
    for (size_t i = 0; i < len; i++)
        argc += v[i] == 0;
    char **argv = xmalloc((argc + 1) * sizeof *argv);
    for (size_t i = 0; i < argc; i++, v += strlen(v) + 1)
        argv[i] = v;
    argv[argc] = NULL;
    return argv;
}

/* Record names; from R_CHECK on, a record may appear once. */
enum { R_ENV, R_DIR, R_FILE, R_LINK, R_END, R_CHECK, R_RUN, R_COLLECT, R_NUMBERS };
static const char *const rec_names[] = {
    "env", "dir", "file", "link", "end", "check", "run", "collect",
    "check_timeout_ms", "timeout_ms", "output_limit", "max_files", "max_bytes", "max_file_bytes",
};
static uint64_t *const rec_numbers[] = {
    &cfg.check_timeout_ms, &cfg.timeout_ms, &cfg.output_limit,
    &cfg.max_files, &cfg.max_bytes, &cfg.max_file_bytes,
};

/* The fewest payload bytes, counted from its first byte, that a record header beginning with
 * p[0..n) (no newline yet) implies: the rest of the header, its value and, unless it is the
 * end record, the next header. A beginning no valid payload has gives n + 1, the byte the
 * parser needs anyway (such a payload is refused whatever follows). */
static uint64_t header_bound(const char *p, size_t n)
{
    const char *sp = memchr(p, ' ', n);
    uint64_t best = UINT64_MAX;
    for (size_t i = 0; i < sizeof rec_names / sizeof rec_names[0]; i++) {
        size_t k = strlen(rec_names[i]);
        uint64_t next = i == R_END ? 0 : MIN_HEADER, v, b;
        if (sp ? (size_t)(sp - p) != k || memcmp(p, rec_names[i], k) != 0
               : n > k || memcmp(p, rec_names[i], n) != 0)
            continue;
        if (!sp)
            b = k + 3 + next; /* the name, " 0\n", the next header */
        else if (n == k + 1)
            b = n + 2 + next; /* "0\n" */
        else if (parse_u64(sp + 1, n - k - 1, &v) == 0)
            b = add_sat(add_sat(n + 1, v), next); /* a newline, at least v bytes of value */
        else
            continue;
        best = b < best ? b : best;
    }
    return best != UINT64_MAX && best > n ? best : n + 1;
}

/* The next line of the payload without its newline; a record header when `record` (then its
 * bound lets the reads run ahead). */
static void read_header(char *line, size_t cap, int record)
{
    uint64_t start = in_at();
    char *nl;
    for (;;) {
        size_t have = in.len - in.pos;
        if ((nl = memchr(in.buf + in.pos, '\n', have < cap ? have : cap)) != NULL)
            break;
        if (have >= cap)
            fatal("payload: a header line is too long");
        if (record) {
            uint64_t end = add_sat(start, header_bound((char *)in.buf + in.pos, have));
            in.sure = end > in.sure ? end : in.sure;
        }
        in_need(have + 1);
    }
    size_t n = (size_t)(nl - (char *)in.buf) - in.pos;
    memcpy(line, in.buf + in.pos, n);
    line[n] = 0;
    in.pos += n + 1;
}

static void read_payload(void)
{
    char line[64], *sp;
    unsigned seen = 0;
    in.sure = strlen("codebox-init 1\n") + MIN_HEADER;
    read_header(line, sizeof line, 0);
    if (strcmp(line, "codebox-init 1") != 0)
        fatal("payload: the first line is not `codebox-init 1`");
    for (;;) {
        uint64_t len;
        int k = -1;
        read_header(line, sizeof line, 1);
        if (!(sp = strchr(line, ' ')) || parse_u64(sp + 1, strlen(sp + 1), &len) < 0)
            fatal("payload: a record header is not `<name> <length>`");
        *sp = 0;
        for (int i = 0; i < (int)(sizeof rec_names / sizeof rec_names[0]); i++)
            if (strcmp(line, rec_names[i]) == 0)
                k = i;
        if (k < 0)
            fatal("payload: unknown record `%.40s`", line);
        if (k >= R_CHECK && (seen & 1u << k))
            fatal("payload: the %s record appears twice", line);
        seen |= 1u << k;
        uint64_t end = add_sat(in_at(), add_sat(len, k == R_END ? 0 : MIN_HEADER));
        in.sure = end > in.sure ? end : in.sure;
        if (k == R_END) {
            if (len != 0)
                fatal("payload: the end record is not empty");
            if (in.pos != in.len) /* the program's stdin would have lost these bytes */
                fatal("payload: read %zu bytes past the end record", in.len - in.pos);
            return;
        }
        if (k == R_FILE) {
            rec_file(len);
            continue;
        }
        if (len > MAX_RECORD || cfg.kept + len > MAX_KEPT)
            fatal("payload: the %s record (%llu bytes) is over the %u-byte limit", line,
                  (unsigned long long)len, len > MAX_RECORD ? MAX_RECORD : MAX_KEPT);
        cfg.kept += len;
        char *v = xmalloc(len + 1);
        in_take(v, len);
        v[len] = 0;
        if (k == R_ENV) {
            char *eq = strchr(v, '=');
            if (strlen(v) != len || !eq || eq == v)
                fatal("payload: an env record is not `KEY=VALUE`");
            cfg.env = realloc(cfg.env, (cfg.nenv + 1) * sizeof *cfg.env);
            if (!cfg.env)
                fatal("out of memory");
            cfg.env[cfg.nenv++] = v;
            continue;
        }
        if (k == R_CHECK || k == R_RUN) {
            *(k == R_CHECK ? &cfg.check : &cfg.run) = parse_argv(v, len, line);
            continue;
        }
        if (k == R_DIR)
            rec_dir(v, len);
        else if (k == R_LINK)
            rec_link(v, len);
        else if (k == R_COLLECT) {
            cfg.collect = !strcmp(v, "none") ? C_NONE : !strcmp(v, "outputs") ? C_OUTPUTS
                        : !strcmp(v, "workspace-on-success") ? C_WORKSPACE : -1;
            if (cfg.collect < 0)
                fatal("payload: collect is `%.40s`, not none, outputs or workspace-on-success", v);
        } else if (parse_u64(v, len, rec_numbers[k - R_NUMBERS]) < 0)
            fatal("payload: the %s record is not a decimal number", line);
        free(v);
    }
}

/* ---- phases ---- */

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void on_signal(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    /* As PID 1, only a SIGTERM from outside the container (si_pid 0 here: the sender is not
     * in this PID namespace) stops the run: the program cannot stop the helper. */
    if (sig == SIGTERM && (!is_init || si->si_pid == 0))
        got_term = 1;
}

/* The program's side of fork: default signals, stdio on the pipes, then exec. Any failure
 * is reported as an errno on the close-on-exec pipe `report`. */
__attribute__((noreturn)) static void child(char **argv, int in, int out, int err, int report)
{
    struct sigaction dfl = { .sa_handler = SIG_DFL };
    sigset_t none;
    if (!is_init)
        setpgid(0, 0);
    for (int s = 1; s < NSIG; s++)
        sigaction(s, &dfl, NULL); /* fails harmlessly for SIGKILL, SIGSTOP and libc's own */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* The helper's non-dumpable state would leave /proc/self owned by root; exec resets it
     * anyway, and no other process of the run is alive yet to take advantage of it. */
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "1000", 4) < 0) { /* best effort */ }
        close(fd);
    }
    if ((in == 0 || dup2(in, 0) == 0) && dup2(out, 1) == 1 && dup2(err, 2) == 2) {
        for (size_t i = 0; i < cfg.nenv; i++)
            putenv(cfg.env[i]); /* PATH from an env record also applies to the lookup */
        execvpe(argv[0], argv, environ);
    }
    int e = errno;
    if (write(report, &e, sizeof e) < 0) { /* the parent then sees a plain exit 127 */ }
    _exit(127);
}

/* Kill every process of the phase but the helper (see the safety note at the top). */
static void kill_rest(pid_t pgid)
{
    if (is_init) {
        kill(-1, SIGKILL);
        return;
    }
    if (pgid > 0)
        killpg(pgid, SIGKILL);
    /* Processes that left the group: as a subreaper, their orphans end up as our children. */
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t me = getpid();
    while (d && (e = readdir(d)) != NULL) {
        char path[300], buf[512], *rp;
        int ppid, fd, pid = atoi(e->d_name);
        if (pid <= 0 || pid == me)
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n > 0 ? n : 0] = 0;
        if ((rp = strrchr(buf, ')')) && sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == me)
            kill(pid, SIGKILL);
    }
    if (d)
        closedir(d);
}

/* Reap every child that has ended; notes the main process's status. Returns -1 when no
 * child is left. */
static int reap(pid_t main_pid, int *status, int *done)
{
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0)
        if (p == main_pid)
            *status = st, *done = 1;
    return p < 0 && errno == ECHILD ? -1 : 0;
}

struct stream { int fd; char kind; uint64_t kept, total; };

/* One read from a pipe: frame what is within output_limit, count everything. Returns 1 after
 * data, 0 at end of file (the pipe is then closed), -1 when nothing is there yet. */
static int pump(struct stream *s)
{
    ssize_t n = read(s->fd, iobuf, CHUNK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return -1;
    if (n <= 0) {
        close(s->fd);
        s->fd = -1;
        return 0;
    }
    s->total += (uint64_t)n;
    if (s->kept < cfg.output_limit) {
        uint64_t k = cfg.output_limit - s->kept < (uint64_t)n ? cfg.output_limit - s->kept : (uint64_t)n;
        frame(s->kind, iobuf, (size_t)k);
        s->kept += k;
    }
    return 1;
}

static int read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = 0;
    return 0;
}

/* The memory cgroup's high-water mark in bytes (v1, then v2), or -1. */
static long long cgroup_peak(void)
{
    char buf[64];
    if (read_file("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", buf, sizeof buf) < 0 &&
        read_file("/sys/fs/cgroup/memory.peak", buf, sizeof buf) < 0)
        return -1;
    return buf[0] >= '0' && buf[0] <= '9' ? atoll(buf) : -1;
}

/* The memory cgroup's OOM kill count (v1 memory.oom_control, v2 memory.events), or -1. */
static long long cgroup_oom_kills(void)
{
    char buf[1024], *p;
    if (read_file("/sys/fs/cgroup/memory/memory.oom_control", buf, sizeof buf) < 0 &&
        read_file("/sys/fs/cgroup/memory.events", buf, sizeof buf) < 0)
        return -1;
    for (p = buf; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, "oom_kill ", 9) == 0)
            return atoll(p + 9);
    return -1;
}

static int64_t cpu_us(const struct rusage *r)
{
    return (int64_t)(r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1000000 +
           r->ru_utime.tv_usec + r->ru_stime.tv_usec;
}

/* Run one phase and write its P, O, E and X frames. Returns 1 when it exited with code 0. */
static int run_phase(const char *name, char **argv, int in, uint64_t timeout_ms)
{
    int out[2], err[2], rep[2], status = 0, done = 0, exec_errno = 0;
    struct rusage ru0, ru1;
    frame('P', name, strlen(name));
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(rep, O_CLOEXEC) < 0)
        fatal("cannot create a pipe: %s", strerror(errno));
    long long oom0 = cgroup_oom_kills();
    getrusage(RUSAGE_CHILDREN, &ru0);
    if (timeout_ms > 1000000000000ULL) /* 31 years: no overflow below */
        timeout_ms = 1000000000000ULL;
    int64_t t0 = now_ns(), deadline = timeout_ms ? t0 + (int64_t)timeout_ms * 1000000 : 0;
    pid_t pid = fork();
    if (pid < 0)
        fatal("cannot fork: %s", strerror(errno));
    if (pid == 0)
        child(argv, in, out[1], err[1], rep[1]);
    if (!is_init)
        setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    close(rep[1]);
    if (read(rep[0], &exec_errno, sizeof exec_errno) != (ssize_t)sizeof exec_errno)
        exec_errno = 0; /* end of file: exec succeeded */
    close(rep[0]);
    struct stream s[2] = { { out[0], 'O', 0, 0 }, { err[0], 'E', 0, 0 } };
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);

    /* Relay until the main process exits, the deadline passes or SIGTERM arrives. */
    const char *end = NULL;
    for (;;) {
        reap(pid, &status, &done);
        if (done)
            break;
        if (got_term) {
            end = "stopped";
            break;
        }
        struct timespec ts, *tp = NULL;
        if (deadline) {
            int64_t left = deadline - now_ns();
            if (left <= 0) {
                end = "timed_out";
                break;
            }
            ts.tv_sec = left / 1000000000, ts.tv_nsec = left % 1000000000, tp = &ts;
        }
        struct pollfd p[2];
        nfds_t n = 0;
        for (int i = 0; i < 2; i++)
            if (s[i].fd >= 0)
                p[n++] = (struct pollfd){ .fd = s[i].fd, .events = POLLIN };
        if (ppoll(p, n, tp, &wait_mask) > 0)
            for (nfds_t i = 0; i < n; i++)
                if (p[i].revents)
                    pump(s[0].fd == p[i].fd ? &s[0] : &s[1]);
    }
    int64_t wall_ms = (now_ns() - t0) / 1000000;

    /* Kill the rest, reap everything, then drain what the pipes still hold. */
    for (;;) {
        kill_rest(pid);
        if (reap(pid, &status, &done) < 0)
            break;
        struct timespec pause = { 0, 5000000 };
        ppoll(NULL, 0, &pause, &wait_mask);
    }
    for (int i = 0; i < 2; i++)
        while (s[i].fd >= 0)
            if (pump(&s[i]) < 0) { /* a writer outlived the kill: should not happen */
                close(s[i].fd);
                s[i].fd = -1;
            }

    getrusage(RUSAGE_CHILDREN, &ru1);
    long long peak = cgroup_peak(), oom1 = cgroup_oom_kills();
    static int warned_peak, warned_oom;
    if (peak < 0 && !warned_peak++)
        warnf("the memory cgroup is not readable: peak_kb is the largest process's resident set");
    if ((oom0 < 0 || oom1 < 0) && !warned_oom++)
        warnf("the memory cgroup's OOM kill count is not readable: oom_kills is -1");

    char x[X_BYTES], arg0[MAX_PATH / 2];
    size_t n = 0;
    appendf(x, sizeof x, &n, "phase=%s\n", name);
    if (exec_errno) {
        snprintf(arg0, sizeof arg0, "%s", argv[0]);
        for (char *c = arg0; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?'; /* one line per key */
        appendf(x, sizeof x, &n, "end=error\n");
        appendf(x, sizeof x, &n, "error=cannot run %s: %s\n", arg0, strerror(exec_errno));
    } else if (end) {
        appendf(x, sizeof x, &n, "end=%s\n", end);
    } else if (WIFEXITED(status)) {
        appendf(x, sizeof x, &n, "end=exited\ncode=%d\n", WEXITSTATUS(status));
    } else {
        appendf(x, sizeof x, &n, "end=signaled\nsignal=%d\n", WTERMSIG(status));
    }
    appendf(x, sizeof x, &n, "wall_ms=%lld\n", (long long)wall_ms);
    appendf(x, sizeof x, &n, "cpu_ms=%lld\n", (long long)((cpu_us(&ru1) - cpu_us(&ru0)) / 1000));
    appendf(x, sizeof x, &n, "peak_kb=%lld\npeak_source=%s\n",
            peak >= 0 ? peak / 1024 : (long long)ru1.ru_maxrss, peak >= 0 ? "cgroup" : "rusage");
    appendf(x, sizeof x, &n, "oom_kills=%lld\n", oom0 < 0 || oom1 < 0 ? -1 : oom1 - oom0);
    appendf(x, sizeof x, &n, "stdout_bytes=%llu\n", (unsigned long long)s[0].total);
    appendf(x, sizeof x, &n, "stderr_bytes=%llu\n", (unsigned long long)s[1].total);
    frame('X', x, n);
    return !exec_errno && !end && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* ---- files back ---- */

struct walk {
    int workspace;      /* workspace-on-success, else outputs */
    int counting;       /* workspace, first pass: only add up the sizes */
    uint64_t listed, files, bytes, total;
    /* outputs, once the entry cap is reached: the entries not listed (counted up to
     * MAX_COUNTED) and the folder the listing stopped in */
    int full;
    uint64_t unlisted;
    unsigned cut_mode;
    char cut[MAX_PATH + 1];
    char path[MAX_PATH + 1];
};

/* Something that cannot be listed: fatal for a workspace (an incomplete copy of the compile
 * stage would fail later, obscurely), a warning for outputs. */
__attribute__((format(printf, 2, 3))) static void problem(struct walk *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage(w->workspace ? '!' : 'W', fmt, ap);
    va_end(ap);
    if (w->workspace)
        exit(125);
}

static void entry(const char *kind, const char *path, unsigned mode, uint64_t size,
                  const char *sha, const char *reason, const char *target)
{
    static char buf[2 * MAX_PATH + 512];
    int n = snprintf(buf, sizeof buf, "%s%c%s%c%o%c%llu%c%s%c%s%c%s", kind, 0, path, 0, mode, 0,
                     (unsigned long long)size, 0, sha, 0, reason, 0, target);
    frame('F', buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void send_link(struct walk *w, int dfd, const char *name, const struct stat *st)
{
    char target[MAX_PATH + 1];
    ssize_t n = readlinkat(dfd, name, target, MAX_PATH);
    target[n > 0 ? n : 0] = 0;
    entry("l", w->path, st->st_mode & 07777, (uint64_t)st->st_size, "",
          "a symbolic link, not followed", target);
}

static void send_file(struct walk *w, int dfd, const char *name, const struct stat *lst)
{
    char hex[65] = "", reason[128] = "";
    struct stat st;
    struct sha256 h;
    uint64_t size = 0;
    ssize_t n;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        if (fd < 0 && errno != ELOOP)
            snprintf(reason, sizeof reason, "not readable: %s", strerror(errno));
        entry("f", w->path, lst->st_mode & 07777, (uint64_t)lst->st_size, "",
              reason[0] ? reason : "not a regular file", "");
        if (fd >= 0)
            close(fd);
        return;
    }
    sha_init(&h);
    while ((n = read(fd, iobuf, CHUNK)) > 0) {
        sha_update(&h, iobuf, (size_t)n);
        size += (uint64_t)n;
    }
    if (n < 0) {
        snprintf(reason, sizeof reason, "not readable: %s", strerror(errno));
        entry("f", w->path, st.st_mode & 07777, (uint64_t)st.st_size, "", reason, "");
        close(fd);
        return;
    }
    sha_hex(&h, hex);
    if (!w->workspace) {
        if (size > cfg.max_file_bytes)
            snprintf(reason, sizeof reason, "over the %llu-byte per-file cap",
                     (unsigned long long)cfg.max_file_bytes);
        else if (w->files >= cfg.max_files)
            snprintf(reason, sizeof reason, "over the %llu-file cap",
                     (unsigned long long)cfg.max_files);
        else if (size > cfg.max_bytes - w->bytes)
            snprintf(reason, sizeof reason, "over the %llu-byte total cap",
                     (unsigned long long)cfg.max_bytes);
        else
            w->files++, w->bytes += size;
    }
    entry("f", w->path, st.st_mode & 07777, size, hex, reason, "");
    for (uint64_t off = 0; !reason[0] && off < size; off += (uint64_t)n) {
        n = pread(fd, iobuf, size - off < CHUNK ? (size_t)(size - off) : CHUNK, (off_t)off);
        if (n <= 0)
            fatal("%s changed while it was being sent", w->path);
        frame('B', iobuf, (size_t)n);
    }
    close(fd);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A max-heap of names by strcmp: v[0] is the greatest. */
static void heap_up(char **v, size_t i)
{
    for (; i > 0 && strcmp(v[(i - 1) / 2], v[i]) < 0; i = (i - 1) / 2) {
        char *t = v[i];
        v[i] = v[(i - 1) / 2], v[(i - 1) / 2] = t;
    }
}

static void heap_down(char **v, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < n && strcmp(v[l], v[m]) > 0)
            m = l;
        if (l + 1 < n && strcmp(v[l + 1], v[m]) > 0)
            m = l + 1;
        if (m == i)
            return;
        char *t = v[i];
        v[i] = v[m], v[m] = t, i = m;
    }
}

/* Count the entry `name` of dfd, a folder at `depth`, and what it holds down to the listing's
 * depth, among the entries the cap leaves out (up to MAX_COUNTED). */
static void count_unlisted(struct walk *w, int dfd, const char *name, int depth)
{
    struct stat st;
    struct dirent *e;
    if (w->unlisted >= MAX_COUNTED)
        return;
    w->unlisted++;
    if (depth >= MAX_DEPTH || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
        !S_ISDIR(st.st_mode))
        return;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    while ((e = readdir(d)) != NULL && w->unlisted < MAX_COUNTED)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            count_unlisted(w, dirfd(d), e->d_name, depth + 1);
    closedir(d);
}

/* Outputs: the entry cap is reached in the folder dfd (w->path[0..plen)); the first time,
 * this is where the listing stopped. */
static void stop_listing(struct walk *w, int dfd, size_t plen)
{
    struct stat st;
    if (w->full)
        return;
    w->full = 1;
    memcpy(w->cut, w->path, plen);
    w->cut[plen] = 0;
    w->cut_mode = fstat(dfd, &st) == 0 ? st.st_mode & 07777 : 0;
}

/* A folder whose contents are not listed: fatal for a workspace (an incomplete copy of the
 * compile stage would fail later, obscurely), an F entry with the reason for outputs. */
static void unlisted_folder(struct walk *w, const struct stat *st, const char *why)
{
    char reason[256];
    if (w->workspace)
        fatal("%s: cannot be copied: %s", w->path, why);
    snprintf(reason, sizeof reason, "the folder's contents are not listed: %s", why);
    entry("d", w->path, st->st_mode & 07777, 0, "", reason, "");
}

/* List the directory dfd, whose path is w->path[0..plen), sorted by name, depth first.
 * Outputs: every entry, folders included, counts towards MAX_LISTED; while scanning, only the
 * names the cap can still list are kept (the first ones by name, in a max-heap), so memory
 * stays bounded whatever the folder holds, and the others are counted as not listed.
 * Workspace: every name is kept, up to MAX_WORKSPACE entries in all. */
static void walk(struct walk *w, int dfd, size_t plen, int depth)
{
    size_t count = 0, cap = 0, keep = w->workspace ? SIZE_MAX : (size_t)(MAX_LISTED - w->listed);
    int dropped = 0;
    char **names = NULL;
    struct dirent *e;
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* an offset of its own */
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        problem(w, "%s: cannot be listed: %s", plen ? w->path : ".", strerror(errno));
        return;
    }
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        if (w->workspace && ++w->listed > MAX_WORKSPACE)
            fatal("the compile stage left more than %d entries", MAX_WORKSPACE);
        if (count < keep) {
            if (count == cap && !(names = realloc(names, (cap = cap * 2 + 16) * sizeof *names)))
                fatal("out of memory");
            if (!(names[count] = strdup(name)))
                fatal("out of memory");
            if (!w->workspace)
                heap_up(names, count);
            count++;
            continue;
        }
        dropped = 1;
        if (count > 0 && strcmp(name, names[0]) < 0) { /* it goes before the greatest kept */
            count_unlisted(w, dfd, names[0], depth);
            free(names[0]);
            if (!(names[0] = strdup(name)))
                fatal("out of memory");
            heap_down(names, count, 0);
        } else {
            count_unlisted(w, dfd, name, depth);
        }
    }
    closedir(d);
    qsort(names, count, sizeof *names, by_name);
    for (size_t i = 0; i < count; i++) {
        const char *name = names[i];
        size_t nlen = strlen(name), len = plen ? plen + 1 + nlen : nlen;
        struct stat st;
        if (!w->workspace && w->listed >= MAX_LISTED) {
            stop_listing(w, dfd, plen);
            count_unlisted(w, dfd, name, depth);
            continue;
        }
        if (len > MAX_PATH) {
            w->path[plen] = 0;
            problem(w, "%s/%s: the path is longer than %d bytes; not listed", w->path, name, MAX_PATH);
            continue;
        }
        if (plen)
            w->path[plen] = '/';
        memcpy(w->path + (plen ? plen + 1 : 0), name, nlen + 1);
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (!w->workspace)
            w->listed++;
        if (S_ISDIR(st.st_mode)) {
            if (w->workspace && !w->counting)
                entry("d", w->path, st.st_mode & 07777, 0, "", "", "");
            if (depth >= MAX_DEPTH) {
                unlisted_folder(w, &st, "deeper than " STR(MAX_DEPTH) " levels");
                continue;
            }
            int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                unlisted_folder(w, &st, strerror(errno));
                continue;
            }
            walk(w, sub, len, depth + 1);
            close(sub);
        } else if (w->counting) {
            if (S_ISREG(st.st_mode))
                w->total += (uint64_t)st.st_size;
        } else if (S_ISLNK(st.st_mode)) {
            send_link(w, dfd, name, &st);
        } else if (S_ISREG(st.st_mode)) {
            send_file(w, dfd, name, &st);
        } else {
            entry("f", w->path, st.st_mode & 07777, 0, "", "not a regular file", "");
        }
    }
    if (dropped)
        stop_listing(w, dfd, plen);
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

static void collect(int run_ok)
{
    static struct walk w;
    struct stat st;
    int wd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (wd < 0)
        fatal("cannot open the working directory: %s", strerror(errno));
    if (cfg.collect == C_OUTPUTS && fstatat(wd, "outputs", &st, AT_SYMLINK_NOFOLLOW) == 0) {
        strcpy(w.path, "outputs");
        if (S_ISLNK(st.st_mode)) {
            send_link(&w, wd, "outputs", &st);
        } else if (S_ISDIR(st.st_mode)) {
            int fd = openat(wd, "outputs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0) {
                unlisted_folder(&w, &st, strerror(errno));
            } else {
                walk(&w, fd, strlen(w.path), 1);
                close(fd);
            }
        }
        if (w.unlisted > 0) {
            char reason[256];
            snprintf(reason, sizeof reason, "the listing stopped in this folder at the %d-entry "
                     "cap: %s%llu more entries are not listed", MAX_LISTED,
                     w.unlisted >= MAX_COUNTED ? "at least " : "", (unsigned long long)w.unlisted);
            entry("d", w.cut, w.cut_mode, 0, "", reason, "");
        }
    } else if (cfg.collect == C_WORKSPACE && run_ok) {
        w.workspace = w.counting = 1;
        walk(&w, wd, 0, 1);
        if (w.total > cfg.max_bytes)
            fatal("the compile stage left %llu bytes; the cap is %llu",
                  (unsigned long long)w.total, (unsigned long long)cfg.max_bytes);
        w.counting = 0;
        w.listed = 0;
        walk(&w, wd, 0, 1);
    }
    close(wd);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--selftest") == 0)
        return selftest();
    if (argc != 1) {
        fputs("usage: codebox-init  (a payload on stdin, frames on stdout: see "
              "docs/sandbox-init.md)\n", stderr);
        return 2;
    }
    is_init = getpid() == 1;
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    /* Whatever was inherited beyond stdio stays out of the program (CLOSE_RANGE_CLOEXEC). */
    if (syscall(SYS_close_range, 3U, ~0U, 4U) < 0)
        for (int fd = 3; fd < 1024; fd++)
            fcntl(fd, F_SETFD, FD_CLOEXEC);

    /* SIGCHLD and SIGTERM are blocked but in ppoll, so no wake-up is ever lost. */
    struct sigaction sa = { .sa_sigaction = on_signal, .sa_flags = SA_SIGINFO };
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &wait_mask);
    sigdelset(&wait_mask, SIGCHLD);
    sigdelset(&wait_mask, SIGTERM);
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);

    read_payload();
    int go = 1, run_ok = 0;
    if (cfg.check) {
        int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (devnull < 0)
            fatal("cannot open /dev/null: %s", strerror(errno));
        go = run_phase("check", cfg.check, devnull, cfg.check_timeout_ms);
        close(devnull);
    }
    if (go && cfg.run && !got_term)
        run_ok = run_phase("run", cfg.run, 0, cfg.timeout_ms);
    if (!got_term) /* stopped: the host wants the container gone, not its files */
        collect(run_ok);
    frame('Z', NULL, 0);
    return 0;
}
