/*
 * codebox-init: PID 1 of every codebox sandbox container.
 *
 * It reads one payload of records on stdin (files, argv, limits), lays out the working
 * directory, runs the optional `check` and then the `run` command, relays their output as
 * frames on stdout, reports how each phase ended and what it used, sends back the files the
 * program left, and exits. A payload that opens with a `session` record starts session mode
 * instead (codebox-init-session.c): one execution after another until the container is
 * removed. The protocol and the behaviour are specified in docs/sandbox-init.md; keep these
 * files and that document in step. codebox-init.h says which file does what.
 *
 * Build: gcc -std=c11 -static -O2 -Wall -Wextra -Werror -o codebox-init codebox-init*.c
 * Self-test of the SHA-256 code: codebox-init --selftest
 *
 * With a check_in_run record the run command is the check and the program in one process
 * (one interpreter start): it says `compiled` on fd 3 when its check passed and waits for `run`
 * on fd 4 before any of the program runs; codebox-init reports the two as the check and the
 * run phases (run_checked in codebox-init-phase.c).
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
 */
#include "codebox-init.h"

const struct config cfg_defaults = { .output_limit = 1 << 20, .max_files = 32,
                                     .max_bytes = 8 << 20, .max_file_bytes = 4 << 20 };
struct config cfg;

int is_init, in_session, out_broken;
volatile sig_atomic_t got_term;
sigset_t wait_mask;
unsigned char iobuf[CHUNK];
char err_text[2 * MAX_PATH + 256];

/* ---- frames ---- */

int write_full(int fd, const void *buf, size_t len)
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
void frame(char kind, const void *data, size_t len)
{
    unsigned char head[5] = { (unsigned char)kind, (unsigned char)(len >> 24),
                              (unsigned char)(len >> 16), (unsigned char)(len >> 8),
                              (unsigned char)len };
    if (out_broken)
        return;
    if (write_full(1, head, sizeof head) < 0 || (len > 0 && write_full(1, data, len) < 0))
        out_broken = 1;
}

void vmessage(char kind, const char *fmt, va_list ap)
{
    char buf[2 * MAX_PATH + 256];
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    if (n < 0)
        n = 0;
    frame(kind, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

void warnf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage('W', fmt, ap);
    va_end(ap);
}

void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage('!', fmt, ap);
    va_end(ap);
    exit(125);
}

int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_text, sizeof err_text, fmt, ap);
    va_end(ap);
    for (char *c = err_text; *c; c++) /* one line: it becomes a key=value line in a session */
        if (*c == '\n' || *c == '\t')
            *c = ' ';
        else if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return -1;
}

/* Append a formatted piece to buf (capacity cap, *n bytes used), whole or not at all: a piece
 * that does not fit is left out rather than cut (a cut `key=value` line would be misread), and
 * *n never passes cap - 1. Returns -1 when the piece was left out. */
int appendf(char *buf, size_t cap, size_t *n, const char *fmt, ...)
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

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fatal("out of memory");
    return p;
}

int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ---- the payload ---- */

static char **driver_argv;

/* Records a run's payload may hold; a session's opening holds only session, env, dir, file,
 * link, timeout_ms and end. */
#define RUN_RECORDS (1u << R_ENV | 1u << R_DIR | 1u << R_FILE | 1u << R_LINK | 1u << R_END | \
                     1u << R_CHECK | 1u << R_RUN | 1u << R_COLLECT | 1u << R_SESSION |      \
                     1u << R_CHECK_TIMEOUT_MS | 1u << R_TIMEOUT_MS | 1u << R_OUTPUT_LIMIT |  \
                     1u << R_MAX_FILES | 1u << R_MAX_BYTES | 1u << R_MAX_FILE_BYTES |        \
                     1u << R_CHECK_IN_RUN)
#define OPENING_RECORDS (1u << R_SESSION | 1u << R_ENV | 1u << R_DIR | 1u << R_FILE |        \
                         1u << R_LINK | 1u << R_TIMEOUT_MS | 1u << R_END)

static void read_payload(void)
{
    char name[64];
    unsigned seen = 0;
    read_magic();
    for (int first = 1;; first = 0) {
        uint64_t len;
        int k = next_record(name, sizeof name, &len);
        if (k < 0 || !(RUN_RECORDS & 1u << k))
            fatal("payload: unknown record `%.40s`", name);
        if (k >= R_CHECK && (seen & 1u << k))
            fatal("payload: the %s record appears twice", name);
        seen |= 1u << k;
        if (k == R_SESSION && !first)
            fatal("payload: the session record must come first");
        if (in_session && !(OPENING_RECORDS & 1u << k))
            fatal("payload: a session's opening has no %s record", name);
        if (k == R_SESSION)
            in_session = 1;
        if (k == R_END) {
            if (len != 0)
                fatal("payload: the end record is not empty");
            in_check_drained("end");
            if (cfg.check_in_run > 1)
                fatal("payload: check_in_run is %llu, not 0 or 1",
                      (unsigned long long)cfg.check_in_run);
            if (cfg.check_in_run && (cfg.check || !cfg.run))
                fatal("payload: check_in_run needs a run record and no check record");
            return;
        }
        if (k == R_FILE) {
            if (rec_file(len) < 0)
                fatal("payload: %s", err_text);
            continue;
        }
        if (len > MAX_RECORD || cfg.kept + len > MAX_KEPT)
            fatal("payload: the %s record (%llu bytes) is over the %u-byte limit", name,
                  (unsigned long long)len, len > MAX_RECORD ? MAX_RECORD : MAX_KEPT);
        cfg.kept += len;
        char *v = xmalloc(len + 1);
        in_take(v, len);
        v[len] = 0;
        if (k == R_ENV) {
            char *eq = strchr(v, '=');
            if (strlen(v) != len || !eq || eq == v)
                fatal("payload: an env record is not `KEY=VALUE`");
            if (!(cfg.env = realloc(cfg.env, (cfg.nenv + 1) * sizeof *cfg.env)))
                fatal("out of memory");
            cfg.env[cfg.nenv++] = v;
            continue;
        }
        if (k == R_CHECK || k == R_RUN || (k == R_SESSION && len > 0)) {
            char **argv = parse_argv(v, len, name);
            if (!argv)
                fatal("payload: %s", err_text);
            *(k == R_CHECK ? &cfg.check : k == R_RUN ? &cfg.run : &driver_argv) = argv;
            continue;
        }
        int rc = 0;
        if (k == R_DIR)
            rc = rec_dir(v, len);
        else if (k == R_LINK)
            rc = rec_link(v, len);
        else if (k == R_COLLECT) {
            cfg.collect = !strcmp(v, "none") ? C_NONE : !strcmp(v, "outputs") ? C_OUTPUTS
                        : !strcmp(v, "workspace-on-success") ? C_WORKSPACE : -1;
            if (cfg.collect < 0)
                fatal("payload: collect is `%.40s`, not none, outputs or workspace-on-success", v);
        } else if (k >= R_NUMBERS) {
            uint64_t *const numbers[] = {
                [R_CHECK_TIMEOUT_MS - R_NUMBERS] = &cfg.check_timeout_ms,
                [R_TIMEOUT_MS - R_NUMBERS] = &cfg.timeout_ms,
                [R_OUTPUT_LIMIT - R_NUMBERS] = &cfg.output_limit,
                [R_MAX_FILES - R_NUMBERS] = &cfg.max_files,
                [R_MAX_BYTES - R_NUMBERS] = &cfg.max_bytes,
                [R_MAX_FILE_BYTES - R_NUMBERS] = &cfg.max_file_bytes,
                [R_CHECK_IN_RUN - R_NUMBERS] = &cfg.check_in_run,
            };
            if (parse_u64(v, len, numbers[k - R_NUMBERS]) < 0)
                fatal("payload: the %s record is not a decimal number", name);
        }
        if (rc < 0)
            fatal("payload: %s", err_text);
        free(v);
    }
}

/* ---- signals ---- */

static void on_signal(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    /* As PID 1, only a SIGTERM from outside the container (si_pid 0 here: the sender is not
     * in this PID namespace) stops the run: the program cannot stop the helper. */
    if (sig == SIGTERM && (!is_init || si->si_pid == 0))
        got_term = 1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--selftest") == 0)
        return selftest() || egress_selftest();
    if (argc != 1) {
        fputs("usage: codebox-init  (a payload on stdin, frames on stdout: see "
              "docs/sandbox-init.md)\n", stderr);
        return 2;
    }
    cfg = cfg_defaults;
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

    /* Before the payload: a run's program finds the relay listening when it starts. */
    if (egress_start() < 0)
        fatal("the egress relay (%s) cannot start: %s", EGRESS_ENV, err_text);
    read_payload();
    if (in_session)
        session_main(driver_argv, cfg.timeout_ms);
    int go = 1, run_ok = 0;
    if (cfg.check) {
        int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (devnull < 0)
            fatal("cannot open /dev/null: %s", strerror(errno));
        go = run_phase("check", cfg.check, devnull, cfg.check_timeout_ms);
        close(devnull);
    }
    if (go && cfg.run && !got_term)
        run_ok = cfg.check_in_run
                     ? run_checked(cfg.run, 0, cfg.check_timeout_ms, cfg.timeout_ms)
                     : run_phase("run", cfg.run, 0, cfg.timeout_ms);
    if (!got_term) /* stopped: the host wants the container gone, not its files */
        collect(run_ok);
    frame('Z', NULL, 0);
    return 0;
}
