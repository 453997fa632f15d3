/*
 * codebox-init: session mode (docs/sandbox-init.md, "Session mode"). After the opening payload,
 * requests follow one another on stdin until the container is removed: `exec` (an execution:
 * files first, then the check and run phases of a files-only session or a cell sent to the
 * driver, then the changed output files) and `read` (a file or folder of the working
 * directory). Each request is answered by frames ending with D. A request that is not
 * understood is answered by D with `error=` and the session goes on.
 *
 * Memory: the records of one request kept in memory come to at most MAX_KEPT bytes (a cell at
 * most that, any other record at most MAX_RECORD), at most MAX_ENV env records; file contents
 * and the execution's stdin are streamed to their files. All of it is freed once the request
 * is answered.
 */
#include "codebox-init.h"
#include <sys/statvfs.h>

#define STDIN_PATH "/tmp/.codebox-stdin" /* an execution's stdin (CODEBOX_CELL_STDIN) */
#define MAX_ENV 1024                     /* env records in one request */
#define DEFAULT_INTERRUPT_MS 2000

/* Records each request may hold (env, check and run: files-only sessions; cell: stateful). */
#define EXEC_RECORDS (1u << R_ENV | 1u << R_DIR | 1u << R_FILE | 1u << R_LINK | 1u << R_END | \
                      1u << R_CHECK | 1u << R_RUN | 1u << R_CELL | 1u << R_STDIN |          \
                      1u << R_COLLECT | 1u << R_CHECK_TIMEOUT_MS | 1u << R_TIMEOUT_MS |      \
                      1u << R_OUTPUT_LIMIT | 1u << R_MAX_FILES | 1u << R_MAX_BYTES |         \
                      1u << R_MAX_FILE_BYTES | 1u << R_RESET | 1u << R_INTERRUPT_MS |        \
                      1u << R_EXECUTION_COUNT)
#define READ_RECORDS (1u << R_PATH | 1u << R_OFFSET | 1u << R_MAX_BYTES | 1u << R_END)

struct request {
    int kind;                 /* R_EXEC or R_READ; -1 when it began otherwise */
    unsigned seen;
    int failed;               /* the first error is in error */
    char error[sizeof err_text];
    uint64_t num[R_COUNT];    /* numeric records */
    char **check, **run, **env, *cell, *path;
    size_t cell_len, nenv, kept;
    int collect;
    void *owned[8];           /* check, run (value and argv), cell, path: freed once answered */
    size_t nowned;
};

static int stateful;          /* a driver keeps the interpreter's state */
static uint64_t executions;   /* executions run (files-only: to tell new from kept) */
static char **session_env;    /* the opening's env records */
static size_t session_nenv;

static void own(struct request *rq, void *p)
{
    rq->owned[rq->nowned++] = p; /* each of these records appears once: within the array */
}

static void request_free(struct request *rq)
{
    for (size_t i = 0; i < rq->nowned; i++)
        free(rq->owned[i]);
    for (size_t i = 0; i < rq->nenv; i++)
        free(rq->env[i]);
    free(rq->env);
}

/* The first error of a request is the one answered; later records are read and dropped. */
static void request_fail(struct request *rq)
{
    if (!rq->failed)
        snprintf(rq->error, sizeof rq->error, "%s", err_text);
    rq->failed = 1;
}

static long long workspace_bytes(void)
{
    struct statvfs v;
    if (statvfs(".", &v) < 0)
        return -1;
    return (long long)(v.f_blocks - v.f_bfree) * (long long)v.f_frsize;
}

/* The D frame: the given key=value lines, then workspace_bytes. */
__attribute__((format(printf, 1, 2))) static void done_frame(const char *fmt, ...)
{
    char d[sizeof err_text + 256];
    size_t n = 0;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(d, sizeof d, fmt, ap);
    va_end(ap);
    n = k < 0 ? 0 : (size_t)k < sizeof d ? (size_t)k : sizeof d - 1;
    long long ws = workspace_bytes();
    if (ws >= 0)
        appendf(d, sizeof d, &n, "workspace_bytes=%lld\n", ws);
    frame('D', d, n);
}

/* One record of a request, applied as it arrives (files are written at once). */
static void request_record(struct request *rq, int k, const char *name, uint64_t len)
{
    unsigned allowed = rq->kind == R_EXEC ? EXEC_RECORDS : READ_RECORDS;
    if (rq->failed) {
        in_skip(len);
        return;
    }
    if (k < 0 || !(allowed & 1u << k)) {
        in_skip(len);
        if (k < 0 || !((EXEC_RECORDS | READ_RECORDS) & 1u << k))
            fail("unknown record `%.40s`", name);
        else
            fail("%s request has no %s record", rq->kind == R_EXEC ? "an exec" : "a read", name);
        request_fail(rq);
        return;
    }
    if (k != R_ENV && k != R_DIR && k != R_FILE && k != R_LINK && (rq->seen & 1u << k)) {
        in_skip(len);
        fail("the %s record appears twice", name);
        request_fail(rq);
        return;
    }
    rq->seen |= 1u << k;
    if (k == R_FILE || k == R_STDIN) {
        if ((k == R_FILE ? rec_file(len) : rec_stdin(len, STDIN_PATH)) < 0)
            request_fail(rq);
        return;
    }
    uint64_t cap = k == R_CELL ? MAX_KEPT : MAX_RECORD;
    if (len > cap || rq->kept + len > MAX_KEPT || (k == R_ENV && rq->nenv >= MAX_ENV)) {
        in_skip(len);
        if (k == R_ENV && rq->nenv >= MAX_ENV)
            fail("more than %d env records", MAX_ENV);
        else
            fail("the %s record (%llu bytes) is over the %llu-byte limit", name,
                 (unsigned long long)len, (unsigned long long)(len > cap ? cap : MAX_KEPT));
        request_fail(rq);
        return;
    }
    rq->kept += len;
    char *v = xmalloc(len + 1);
    in_take(v, len);
    v[len] = 0;
    int rc = 0;
    if (k == R_ENV) {
        char *eq = strchr(v, '=');
        if (strlen(v) != len || !eq || eq == v) {
            free(v);
            rc = fail("an env record is not `KEY=VALUE`");
        } else {
            if (!(rq->env = realloc(rq->env, (rq->nenv + 1) * sizeof *rq->env)))
                fatal("out of memory");
            rq->env[rq->nenv++] = v;
        }
        if (rc < 0)
            request_fail(rq);
        return;
    }
    if (k == R_CHECK || k == R_RUN) {
        char **argv = parse_argv(v, len, name);
        own(rq, v);
        if (argv)
            own(rq, argv);
        *(k == R_CHECK ? &rq->check : &rq->run) = argv;
        rc = argv ? 0 : -1;
    } else if (k == R_CELL) {
        own(rq, v);
        rq->cell = v, rq->cell_len = len;
    } else if (k == R_PATH) {
        own(rq, v);
        rq->path = v;
        if (!(len == 1 && v[0] == '.'))
            rc = check_path(v, len, "path");
    } else {
        if (k == R_DIR) {
            rc = rec_dir(v, len);
        } else if (k == R_LINK) {
            rc = rec_link(v, len);
        } else if (k == R_COLLECT) {
            rq->collect = !strcmp(v, "none") ? C_NONE : !strcmp(v, "outputs") ? C_OUTPUTS : -1;
            if (rq->collect < 0)
                rc = fail("collect is `%.40s`, not none or outputs", v);
        } else if (k >= R_NUMBERS) {
            if (parse_u64(v, len, &rq->num[k]) < 0)
                rc = fail("the %s record is not a decimal number", name);
            else if (k == R_RESET && rq->num[k] > 1)
                rc = fail("the reset record is not 0 or 1");
        }
        free(v);
    }
    if (rc < 0)
        request_fail(rq);
}

/* Read one request, applying its records. */
static void read_request(struct request *rq)
{
    char name[64];
    uint64_t len;
    memset(rq, 0, sizeof *rq);
    in_idle = 1; /* a SIGTERM before the request's first byte is ignored (records.c) */
    int k = next_record(name, sizeof name, &len);
    in_idle = 0;
    rq->kind = k == R_EXEC || k == R_READ ? k : -1;
    if (rq->kind < 0 || len != 0) {
        if (k == R_END) {
            fail("a request begins with an exec or read record, not end");
            request_fail(rq);
            return;
        }
        in_skip(len);
        if (rq->kind < 0)
            fail("a request begins with an exec or read record, not `%.40s`", name);
        else
            fail("the %s record is not empty", name);
        request_fail(rq);
        rq->kind = R_EXEC; /* the rest is read as an exec request's, and dropped */
    }
    for (;;) {
        k = next_record(name, sizeof name, &len);
        if (k == R_END) {
            if (len != 0)
                fatal("request: the end record is not empty");
            in_check_drained("end");
            return;
        }
        request_record(rq, k, name, len);
    }
}

/* The execution's limits and collection from its records, else the defaults. */
static void apply_limits(const struct request *rq)
{
    cfg = cfg_defaults;
    uint64_t *const dst[R_COUNT] = {
        [R_CHECK_TIMEOUT_MS] = &cfg.check_timeout_ms, [R_TIMEOUT_MS] = &cfg.timeout_ms,
        [R_OUTPUT_LIMIT] = &cfg.output_limit,         [R_MAX_FILES] = &cfg.max_files,
        [R_MAX_BYTES] = &cfg.max_bytes,               [R_MAX_FILE_BYTES] = &cfg.max_file_bytes,
    };
    for (int k = R_NUMBERS; k < R_COUNT; k++)
        if (dst[k] && (rq->seen & 1u << k))
            *dst[k] = rq->num[k];
    cfg.collect = rq->seen & 1u << R_COLLECT ? rq->collect : C_NONE;
    cfg.env = session_env, cfg.nenv = session_nenv;
}

/* A SIGTERM came once the request had begun and before anything ran: the execution is
 * stopped at once. */
static void stopped_before_start(const char *state)
{
    char x[256];
    size_t n = 0;
    frame('P', "run", 3);
    appendf(x, sizeof x, &n, "phase=run\nend=stopped\nwall_ms=0\ncpu_ms=0\noom_kills=0\n"
            "stdout_bytes=0\nstderr_bytes=0\n");
    frame('X', x, n);
    done_frame("state=%s\n", state);
}

static void exec_files_only(struct request *rq)
{
    const char *state = executions++ == 0 ? "new" : "kept";
    char **env = xmalloc((session_nenv + rq->nenv + 1) * sizeof *env);
    memcpy(env, session_env, session_nenv * sizeof *env);
    memcpy(env + session_nenv, rq->env, rq->nenv * sizeof *env);
    cfg.env = env, cfg.nenv = session_nenv + rq->nenv;
    int stdin_fd = open(STDIN_PATH, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (stdin_fd < 0) {
        free(env);
        fail("cannot open %s: %s", STDIN_PATH, strerror(errno));
        done_frame("error=%s\n", err_text);
        return;
    }
    fcntl(stdin_fd, F_SETFL, 0); /* opened without blocking, read as an ordinary file */
    if (got_term) {
        stopped_before_start(state);
    } else {
        int go = 1, run_ok = 0;
        if (rq->check) {
            int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (devnull < 0)
                fatal("cannot open /dev/null: %s", strerror(errno));
            go = run_phase("check", rq->check, devnull, cfg.check_timeout_ms);
            close(devnull);
        }
        if (go && !got_term)
            run_ok = run_phase("run", rq->run, stdin_fd, cfg.timeout_ms);
        if (!got_term)
            collect(run_ok);
        done_frame("state=%s\n", state);
    }
    close(stdin_fd);
    free(env);
}

static void exec_stateful(struct request *rq)
{
    const char *why = NULL;
    if (!driver_running())
        why = "";
    else if (rq->num[R_RESET])
        why = "", driver_stop();
    else if (driver_check_idle() < 0)
        why = "", driver_stop();
    if (why && driver_start() < 0) {
        char text[sizeof err_text];
        snprintf(text, sizeof text, "%s", err_text);
        /* the interpreter is gone: the next execution starts one afresh, or says why not */
        done_frame("state=reset\nreason=driver_exited\nerror=cannot start the driver: %s\n", text);
        return;
    }
    const char *state = driver_fresh() ? "new" : "kept";
    executions++;
    if (got_term) {
        stopped_before_start(state);
        return;
    }
    struct cell c = {
        .code = rq->cell, .code_len = rq->cell_len,
        .number = rq->seen & 1u << R_EXECUTION_COUNT ? rq->num[R_EXECUTION_COUNT] : executions,
        .check_timeout_ms = cfg.check_timeout_ms ? cfg.check_timeout_ms : cfg.timeout_ms,
        .timeout_ms = cfg.timeout_ms,
        .interrupt_ms = rq->seen & 1u << R_INTERRUPT_MS ? rq->num[R_INTERRUPT_MS]
                                                      : DEFAULT_INTERRUPT_MS,
    };
    struct cell_outcome o;
    driver_run_cell(&c, &o);
    if (!o.stopped)
        collect(0);
    if (o.reset && driver_start() < 0)
        warnf("the driver could not be started again (the next execution tries again): %s",
              err_text);
    char d[128];
    size_t n = 0;
    appendf(d, sizeof d, &n, "state=%s\n", o.reset ? "reset" : state);
    if (o.reset)
        appendf(d, sizeof d, &n, "reason=%s\n", o.reason);
    if (o.has_result)
        appendf(d, sizeof d, &n, "result_bytes=%llu\n", (unsigned long long)o.result_bytes);
    done_frame("%s", d);
}

static void exec_request(struct request *rq)
{
    if (!rq->failed) {
        const char *missing = stateful ? "cell" : "run";
        /* env records in a stateful session are accepted and ignored: the host sends the
         * language's env with every execution, and the driver has the opening's already */
        unsigned wrong = stateful ? (1u << R_CHECK | 1u << R_RUN) : 1u << R_CELL;
        for (int k = 0; k < R_COUNT; k++)
            if (rq->seen & wrong & 1u << k) {
                fail("a %s session's exec request has no %s record",
                     stateful ? "stateful" : "files-only", rec_names[k]);
                request_fail(rq);
                break;
            }
        if (!rq->failed && !(rq->seen & 1u << (stateful ? R_CELL : R_RUN))) {
            fail("a %s session's exec request needs a %s record",
                 stateful ? "stateful" : "files-only", missing);
            request_fail(rq);
        }
    }
    if (!rq->failed && !(rq->seen & 1u << R_STDIN) && write_empty(STDIN_PATH) < 0)
        request_fail(rq);
    if (rq->failed) {
        done_frame("error=%s\n", rq->error);
        return;
    }
    apply_limits(rq);
    if (stateful)
        exec_stateful(rq);
    else
        exec_files_only(rq);
}

/* ---- read ---- */

/* Open the folder that holds `path` without following a symbolic link at any component;
 * *leaf points at the last component. -1 with the reason in err_text. */
static int open_parent_nofollow(char *path, const char **leaf)
{
    int dfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char *comp = path, *slash;
    if (dfd < 0)
        return fail("cannot open the working directory: %s", strerror(errno));
    while ((slash = strchr(comp, '/')) != NULL) {
        struct stat st;
        *slash = 0;
        int fd = open_dir_at(dfd, comp), e = errno;
        int link = fd < 0 && fstatat(dfd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
        *slash = '/';
        close(dfd);
        if (fd < 0 && link)
            return fail("%s: %.*s is a symbolic link, not followed", path, (int)(slash - path), path);
        if (fd < 0)
            return fail("%s: %s", path, strerror(e));
        dfd = fd;
        comp = slash + 1;
    }
    *leaf = comp;
    return dfd;
}

/* A folder's listing: its F entry, then one per entry directly in it, sorted, at most
 * MAX_LISTED (the folder's reason says how many more there are). */
static int read_folder(int fd, const char *path, const struct stat *st)
{
    struct heap_names names = { .keep = MAX_LISTED };
    struct dirent *e;
    char reason[160] = "", full[MAX_PATH + 2];
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return fail("cannot list %s: %s", path, strerror(errno));
    }
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            free(names_add(&names, e->d_name));
    names_sort(&names);
    if (names.dropped)
        snprintf(reason, sizeof reason, "the listing stopped at the %d-entry cap: %llu more "
                 "entries are not listed", MAX_LISTED, (unsigned long long)names.dropped);
    entry("d", path, st->st_mode & 07777, 0, "", reason, "");
    for (size_t i = 0; i < names.n; i++) {
        struct stat est;
        char target[MAX_PATH + 1] = "";
        const char *name = names.v[i];
        if (fstatat(dirfd(d), name, &est, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (strcmp(path, ".") == 0)
            snprintf(full, sizeof full, "%s", name);
        else if ((size_t)snprintf(full, sizeof full, "%s/%s", path, name) >= sizeof full)
            continue;
        if (S_ISDIR(est.st_mode)) {
            entry("d", full, est.st_mode & 07777, 0, "", "", "");
        } else if (S_ISLNK(est.st_mode)) {
            ssize_t n = readlinkat(dirfd(d), name, target, MAX_PATH);
            target[n > 0 ? n : 0] = 0;
            entry("l", full, est.st_mode & 07777, (uint64_t)est.st_size, "",
                  "a symbolic link, not followed", target);
        } else {
            entry("f", full, est.st_mode & 07777, S_ISREG(est.st_mode) ? (uint64_t)est.st_size : 0,
                  "", S_ISREG(est.st_mode) ? "listed" : "not a regular file", "");
        }
    }
    names_free(&names);
    closedir(d);
    return 0;
}

/* A regular file's F entry (its whole size and SHA-256, and `range <n>`: n bytes follow), then
 * its bytes from offset, at most max_bytes, in B frames. */
static int read_regular(int fd, const char *path, const struct stat *st, uint64_t offset,
                        uint64_t max_bytes)
{
    struct sha256 h;
    char hex[65];
    uint64_t size = 0, whole = (uint64_t)st->st_size;
    ssize_t n = 0;
    /* Hashed up to the size it had when opened: a file that keeps growing is not followed. */
    sha_init(&h);
    while (size < whole) {
        size_t want = whole - size < CHUNK ? (size_t)(whole - size) : CHUNK;
        if ((n = read(fd, iobuf, want)) <= 0)
            break;
        sha_update(&h, iobuf, (size_t)n);
        size += (uint64_t)n;
    }
    if (n < 0)
        return fail("cannot read %s: %s", path, strerror(errno));
    sha_hex(&h, hex);
    uint64_t end = offset >= size ? offset : size - offset < max_bytes ? size : offset + max_bytes;
    char range[40];
    snprintf(range, sizeof range, "range %llu", (unsigned long long)(end - offset));
    entry("f", path, st->st_mode & 07777, size, hex, range, "");
    for (uint64_t off = offset; off < end; off += (uint64_t)n) {
        size_t want = end - off < CHUNK ? (size_t)(end - off) : CHUNK;
        n = pread(fd, iobuf, want, (off_t)off);
        if (n <= 0) { /* the driver's threads may still write: pad, do not die */
            warnf("%s changed while it was being read", path);
            memset(iobuf, 0, want);
            n = (ssize_t)want;
        }
        frame('B', iobuf, (size_t)n);
    }
    return 0;
}

static void read_request_answer(struct request *rq)
{
    const char *leaf = ".";
    struct stat st;
    int dfd = -1, fd = -1, rc = 0;
    uint64_t offset = rq->num[R_OFFSET];
    uint64_t max_bytes = rq->seen & 1u << R_MAX_BYTES ? rq->num[R_MAX_BYTES] : cfg_defaults.output_limit;
    if (rq->failed || !rq->path) {
        if (!rq->failed)
            snprintf(rq->error, sizeof rq->error, "a read request needs a path record");
        done_frame("error=%s\n", rq->error);
        return;
    }
    char *path = rq->path;
    if (strcmp(path, ".") == 0) {
        leaf = ".";
        if ((dfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
            fail("cannot open the working directory: %s", strerror(errno));
    } else {
        dfd = open_parent_nofollow(path, &leaf);
    }
    if (dfd < 0) {
        rc = -1;
    } else if (fstatat(dfd, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        rc = fail("%s: %s", path, strerror(errno));
    } else if (S_ISLNK(st.st_mode)) {
        char target[MAX_PATH + 1];
        ssize_t n = readlinkat(dfd, leaf, target, MAX_PATH);
        target[n > 0 ? n : 0] = 0;
        entry("l", path, st.st_mode & 07777, (uint64_t)st.st_size, "",
              "a symbolic link, not followed", target);
    } else if (S_ISDIR(st.st_mode)) {
        fd = open_dir_at(dfd, leaf);
        rc = fd < 0 ? fail("cannot list %s: %s", path, strerror(errno)) : read_folder(fd, path, &st);
        fd = -1; /* read_folder closed it */
    } else if (!S_ISREG(st.st_mode)) {
        entry("f", path, st.st_mode & 07777, 0, "", "not a regular file", "");
    } else {
        /* What was checked by name may have been swapped since (a FIFO would hold this
         * process): the opened descriptor is checked again, opened without blocking. */
        struct stat fst;
        fd = openat(dfd, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0 && errno == ELOOP)
            entry("l", path, st.st_mode & 07777, 0, "", "a symbolic link, not followed", "");
        else if (fd < 0 || fstat(fd, &fst) < 0)
            rc = fail("cannot read %s: %s", path, strerror(errno));
        else if (!S_ISREG(fst.st_mode))
            entry("f", path, fst.st_mode & 07777, 0, "", "not a regular file", "");
        else if (fcntl(fd, F_SETFL, 0) < 0)
            rc = fail("cannot read %s: %s", path, strerror(errno));
        else
            rc = read_regular(fd, path, &fst, offset, max_bytes);
    }
    if (fd >= 0)
        close(fd);
    if (dfd >= 0)
        close(dfd);
    if (rc < 0)
        done_frame("error=%s\n", err_text);
    else
        done_frame("%s", "");
}

/* ---- the session ---- */

void session_main(char **driver_argv, uint64_t start_timeout_ms)
{
    session_env = cfg.env, session_nenv = cfg.nenv;
    stateful = driver_argv != NULL;
    if (stateful) {
        driver_init(driver_argv, session_env, session_nenv, start_timeout_ms, STDIN_PATH);
        if (write_empty(STDIN_PATH) < 0 || driver_start() < 0)
            fatal("the session's driver cannot start: %s", err_text);
    }
    done_frame("state=new\n");
    for (;;) {
        struct request rq;
        /* A SIGTERM outside an execution means nothing. One the host sent for the execution
         * that just ended can still be pending (blocked while the answer was written): let it
         * in before forgetting, or it would stop the next execution the moment its request
         * is there. The host's signal calls have all returned before it writes that request. */
        static const struct timespec now = { 0, 0 };
        ppoll(NULL, 0, &now, &wait_mask);
        got_term = 0;
        read_request(&rq);
        if (rq.kind == R_READ)
            read_request_answer(&rq);
        else
            exec_request(&rq);
        request_free(&rq);
    }
}
