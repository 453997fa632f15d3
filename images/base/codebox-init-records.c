/*
 * codebox-init: reading records from stdin, and laying out the files they name.
 *
 * Stdin is read through a buffer, but never past the end record of a payload or request: in a
 * run, what follows it is the program's stdin, which the program reads from the same pipe; in
 * a session, nothing is taken before it is known to belong to the request being read. So a
 * read asks only for what the parser needs now, or more when the input is known to hold more:
 * after a record header, its value and the shortest next header (`end 0\n`); in a partial
 * header, the least that its name and the digits so far imply (header_bound). A payload of n
 * records takes about n reads.
 *
 * Errors in a record's value (a bad path, a file that cannot be created) go through fail():
 * fatal in a run, a failed request in a session. Only an input that cannot be followed any more
 * (a header that is not `<name> <length>`, stdin closed) is fatal here.
 */
#include "codebox-init.h"

const char *const rec_names[R_COUNT] = {
    "env", "dir", "file", "link", "end", "check", "run", "collect", "session", "exec", "read",
    "cell", "stdin", "path", "check_timeout_ms", "timeout_ms", "output_limit", "max_files",
    "max_bytes", "max_file_bytes", "reset", "interrupt_ms", "offset", "execution_count",
    "check_in_run",
};

static struct {
    unsigned char buf[CHUNK];
    size_t pos, len;   /* unread bytes: buf[pos..len) */
    uint64_t off;      /* bytes read from stdin so far */
    uint64_t sure;     /* stdin offset up to which every byte belongs to the payload */
} in;

#define MIN_HEADER 6 /* `end 0\n`, the shortest record header */

int in_idle;

static const char *what(void)
{
    return in_session ? "request" : "payload";
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Stdin offset of the next unread byte. */
static uint64_t in_at(void)
{
    return in.off - (in.len - in.pos);
}

/* Whether stdin has a byte to read now. */
static int input_ready(void)
{
    struct pollfd p = { .fd = 0, .events = POLLIN };
    return poll(&p, 1, 0) > 0;
}

/* Make at least `need` (at most CHUNK) unread bytes available. Waits in ppoll, the only place
 * where SIGTERM is let through, so that a stop ends a wait for a payload that never comes; a
 * read follows only a ppoll that found input, so it never blocks with SIGTERM masked.
 * In a session a SIGTERM never ends the wait: one that wakes the wait for a request while no
 * byte of it is there (in_idle), or is still pending when its first byte is found, is outside
 * any execution and is dropped; one that comes once the request has begun stays set and stops
 * that execution before it runs. */
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
        if (got_term && !in_session)
            fatal("stopped (SIGTERM) while reading the payload");
        if (r < 0 && errno != EINTR)
            fatal("%s: poll: %s", what(), strerror(errno));
        if (r <= 0) {
            if (got_term && in_idle && !input_ready())
                got_term = 0;
            continue;
        }
        if (in_session && in_idle) {
            /* The first byte of a request is there. A SIGTERM still pending (ppoll found input
             * and left the signal for later) was sent before that byte: for the execution that
             * ended, or so early for this one that the host repeats it. */
            static const struct timespec zero = { 0, 0 };
            ppoll(NULL, 0, &zero, &wait_mask);
            got_term = 0;
        }
        ssize_t n = read(0, in.buf + in.len, want);
        if (n == 0)
            fatal("%s: the input ended before the end record", what());
        if (n < 0 && errno != EINTR && errno != EAGAIN)
            fatal("%s: read: %s", what(), strerror(errno));
        if (n > 0)
            in.len += (size_t)n, in.off += (uint64_t)n, in_idle = 0;
    }
}

/* Copy the next n bytes of the input to dst. */
void in_take(void *dst, size_t n)
{
    char *p = dst;
    while (n > 0) {
        in_need(1);
        size_t k = in.len - in.pos < n ? in.len - in.pos : n;
        memcpy(p, in.buf + in.pos, k);
        in.pos += k, p += k, n -= k;
    }
}

/* Drop the next n bytes of the input. */
void in_skip(uint64_t n)
{
    while (n > 0) {
        in_need(1);
        size_t k = in.len - in.pos < n ? in.len - in.pos : (size_t)n;
        in.pos += k, n -= k;
    }
}

/* At an end record: nothing was read past it (in a run, the program's stdin would have lost
 * those bytes). */
void in_check_drained(const char *rec)
{
    if (in.pos != in.len)
        fatal("%s: read %zu bytes past the %s record", what(), in.len - in.pos, rec);
}

int parse_u64(const char *s, size_t n, uint64_t *out)
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

static int parse_mode(const char *s, size_t n, const char *rec, unsigned *mode)
{
    unsigned m = 0;
    if (n == 0)
        return fail("%s record: no mode", rec);
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '7' || m > 0777)
            return fail("%s record: the mode is not an octal number up to 7777", rec);
        m = m * 8 + (unsigned)(s[i] - '0');
    }
    *mode = m;
    return 0;
}

/* A path relative to the working directory: no empty, `.` or `..` component. */
int check_path(const char *p, size_t n, const char *rec)
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
        return fail("%s record: invalid path \"%.*s\" (relative, at most %d bytes, no empty, "
                    "`.` or `..` component)", rec, (int)(n < 200 ? n : 200), p, MAX_PATH);
    return 0;
}

/* Open the directory `name` of dfd for reading, never through a symbolic link: ENOTDIR when
 * name is anything but a directory. O_DIRECTORY | O_NOFOLLOW alone is not enough: gVisor
 * (release 20221219) follows a link to a directory with those flags; an O_PATH descriptor of
 * the name itself, checked with fstat, then reopened, is right everywhere. */
int open_dir_at(int dfd, const char *name)
{
    struct stat st;
    int path = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC), fd = -1;
    if (path < 0)
        return -1;
    if (fstat(path, &st) == 0 && S_ISDIR(st.st_mode))
        fd = openat(path, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    else
        errno = ENOTDIR;
    int e = errno;
    close(path);
    errno = e;
    return fd;
}

/* Open the directory that holds `path`, walking (and creating, 0755) its parents without
 * following symbolic links. Returns the fd and points *leaf at the last component, or -1. */
static int open_parent(char *path, const char **leaf)
{
    int dfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char *comp = path, *slash;
    if (dfd < 0)
        return fail("cannot open the working directory: %s", strerror(errno));
    while ((slash = strchr(comp, '/')) != NULL) {
        *slash = 0;
        int fd = open_dir_at(dfd, comp);
        if (fd < 0 && errno == ENOENT && mkdirat(dfd, comp, 0755) == 0) {
            fd = open_dir_at(dfd, comp);
            if (fd >= 0 && fchmod(fd, 0755) < 0) {
                fail("cannot chmod the directory %s: %s", path, strerror(errno));
                close(fd);
                fd = -2;
            }
        }
        if (fd == -1)
            fail("cannot open the directory %s: %s", path, strerror(errno));
        *slash = '/';
        close(dfd);
        if (fd < 0)
            return -1;
        dfd = fd;
        comp = slash + 1;
    }
    *leaf = comp;
    return dfd;
}

/* Session: make room for a file or link at leaf by unlinking what is there (a link or FIFO is
 * removed, never followed or opened); a directory there is an error. */
static int make_room(int dfd, const char *leaf, const char *path)
{
    if (!in_session || unlinkat(dfd, leaf, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno == EISDIR)
        return fail("cannot replace %s: it is a directory", path);
    return fail("cannot replace %s: %s", path, strerror(errno));
}

int rec_dir(char *v, size_t len)
{
    char *sp = memchr(v, ' ', len);
    const char *leaf;
    unsigned mode;
    if (!sp || strlen(v) != len)
        return fail("a dir record is not `<mode> <path>`");
    char *path = sp + 1;
    if (parse_mode(v, (size_t)(sp - v), "dir", &mode) < 0 ||
        check_path(path, strlen(path), "dir") < 0)
        return -1;
    int dfd = open_parent(path, &leaf), fd = -1, rc = 0;
    if (dfd < 0)
        return -1;
    if (mkdirat(dfd, leaf, 0700) < 0 && errno != EEXIST)
        rc = fail("cannot create the directory %s: %s", path, strerror(errno));
    else if ((fd = open_dir_at(dfd, leaf)) < 0 ||
             fchmod(fd, mode) < 0)
        rc = fail("cannot create the directory %s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    close(dfd);
    return rc;
}

int rec_link(char *v, size_t len)
{
    char *nul = memchr(v, 0, len), *target;
    const char *leaf;
    if (!nul)
        return fail("a link record is not `<path>\\0<target>`");
    target = nul + 1;
    size_t tlen = len - (size_t)(target - v);
    if (tlen == 0 || tlen > MAX_PATH || strlen(target) != tlen)
        return fail("link record %.200s: the target is empty, too long or holds a NUL", v);
    if (check_path(v, (size_t)(nul - v), "link") < 0)
        return -1;
    int dfd = open_parent(v, &leaf), rc = 0;
    if (dfd < 0)
        return -1;
    if (make_room(dfd, leaf, v) < 0)
        rc = -1;
    else if (symlinkat(target, dfd, leaf) < 0)
        rc = fail("cannot create the link %s: %s", v, strerror(errno));
    close(dfd);
    return rc;
}

/* Copy the next `left` bytes of the input to fd (hashing them when h is given). After a write
 * error the rest is still read, so that the input stays in step. */
static int stream_to(int fd, uint64_t left, struct sha256 *h, const char *name)
{
    int rc = 0;
    while (left > 0) {
        in_need(1);
        size_t k = in.len - in.pos < left ? in.len - in.pos : (size_t)left;
        if (rc == 0 && write_full(fd, in.buf + in.pos, k) < 0)
            rc = fail("cannot write %s: %s", name, strerror(errno));
        if (rc == 0 && h)
            sha_update(h, in.buf + in.pos, k);
        in.pos += k;
        left -= k;
    }
    return rc;
}

/* A file record is streamed to its file: its content never sits in memory. In a session a file
 * replaces what is at its path, and one under outputs/ is remembered as returned. */
int rec_file(uint64_t len)
{
    char head[MAX_PATH + 16], *sp, *path;
    const char *leaf;
    unsigned mode;
    size_t m = len < sizeof head - 1 ? (size_t)len : sizeof head - 1, n;
    in_need(m);
    char *nul = memchr(in.buf + in.pos, 0, m);
    if (!nul) {
        in_skip(len);
        return fail("a file record has no NUL within %zu bytes", m);
    }
    n = (size_t)(nul - (char *)in.buf) - in.pos;
    memcpy(head, in.buf + in.pos, n + 1);
    in.pos += n + 1;
    uint64_t left = len - n - 1;
    if (!(sp = memchr(head, ' ', n))) {
        in_skip(left);
        return fail("a file record is not `<mode> <path>\\0<content>`");
    }
    path = sp + 1;
    int dfd = -1, fd = -1, rc = -1;
    if (parse_mode(head, (size_t)(sp - head), "file", &mode) == 0 &&
        check_path(path, strlen(path), "file") == 0 && (dfd = open_parent(path, &leaf)) >= 0 &&
        make_room(dfd, leaf, path) == 0) {
        fd = openat(dfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
            fail("cannot create the file %s: %s", path, strerror(errno));
    }
    if (fd < 0) {
        in_skip(left);
    } else {
        struct sha256 h;
        int output = in_session && strncmp(path, "outputs/", 8) == 0;
        sha_init(&h);
        char name[MAX_PATH + 16];
        snprintf(name, sizeof name, "the file %s", path);
        rc = stream_to(fd, left, output ? &h : NULL, name);
        if (rc == 0 && fchmod(fd, mode) < 0)
            rc = fail("cannot chmod the file %s: %s", path, strerror(errno));
        if (rc == 0 && output) {
            unsigned char sha[32];
            sha_bytes(&h, sha);
            remember(path, sha);
        }
        close(fd);
    }
    if (dfd >= 0)
        close(dfd);
    return rc;
}

/* Session: an execution's stdin, streamed to the file at `path` (replaced, never followed). */
int rec_stdin(uint64_t len, const char *path)
{
    if (unlink(path) < 0 && errno != ENOENT) {
        in_skip(len);
        return fail("cannot replace %s: %s", path, strerror(errno));
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        in_skip(len);
        return fail("cannot create %s: %s", path, strerror(errno));
    }
    int rc = stream_to(fd, len, NULL, path);
    close(fd);
    return rc;
}

int write_empty(const char *path)
{
    return rec_stdin(0, path);
}

/* argv: each argument followed by a NUL byte. Points into v; NULL when malformed. */
char **parse_argv(char *v, size_t len, const char *rec)
{
    size_t argc = 0;
    if (len == 0 || v[len - 1] != 0 || v[0] == 0) {
        fail("the %s record is not a list of NUL-terminated arguments", rec);
        return NULL;
    }
    for (size_t i = 0; i < len; i++)
        argc += v[i] == 0;
    char **argv = xmalloc((argc + 1) * sizeof *argv);
    for (size_t i = 0; i < argc; i++, v += strlen(v) + 1)
        argv[i] = v;
    argv[argc] = NULL;
    return argv;
}

/* The fewest input bytes, counted from its first byte, that a record header beginning with
 * p[0..n) (no newline yet) implies: the rest of the header, its value and, unless it is the
 * end record, the next header. A beginning no valid input has gives n + 1, the byte the
 * parser needs anyway. */
static uint64_t header_bound(const char *p, size_t n)
{
    const char *sp = memchr(p, ' ', n);
    uint64_t best = UINT64_MAX;
    for (size_t i = 0; i < R_COUNT; i++) {
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

/* The next line of the input without its newline; a record header when `record` (then its
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
            fatal("%s: a header line is too long", what());
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

void read_magic(void)
{
    char line[64];
    in.sure = strlen("codebox-init 1\n") + MIN_HEADER;
    read_header(line, sizeof line, 0);
    if (strcmp(line, "codebox-init 1") != 0)
        fatal("payload: the first line is not `codebox-init 1`");
}

/* The next record header: its name (into name, at most cap - 1 bytes kept), its value's length,
 * and the record's index in rec_names, or -1 for a name not there. */
int next_record(char *name, size_t cap, uint64_t *len)
{
    char line[64], *sp;
    int k = -1;
    read_header(line, sizeof line, 1);
    if (!(sp = strchr(line, ' ')) || parse_u64(sp + 1, strlen(sp + 1), len) < 0)
        fatal("%s: a record header is not `<name> <length>`", what());
    *sp = 0;
    for (int i = 0; i < R_COUNT; i++)
        if (strcmp(line, rec_names[i]) == 0)
            k = i;
    snprintf(name, cap, "%s", line);
    uint64_t end = add_sat(in_at(), add_sat(*len, k == R_END ? 0 : MIN_HEADER));
    in.sure = end > in.sure ? end : in.sure;
    return k;
}
