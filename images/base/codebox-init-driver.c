/*
 * codebox-init: a stateful session's driver (docs/sandbox-init.md, "The driver protocol").
 * The driver is a program in the language's image that keeps an interpreter between cells. It
 * runs with fd 0 on /dev/null, fds 1 and 2 on the session's output pipes, fd 3 for the cells
 * it is sent and fd 4 for its one-line replies. This file starts it, sends it a cell, relays
 * what the cell prints, enforces the deadline (interrupt first, SIGINT; kill and restart when
 * the interrupt is not answered in time), ends every other process the cell started, and
 * writes the cell's phases (P, O, E, X) and its result (R).
 *
 * Everything the driver says is untrusted: the cell runs in its process and can forge or break
 * the protocol. Lines are capped at MAX_LINE bytes, the result kept is capped, every deadline
 * is this file's, and a driver that does not follow the protocol is killed and reported as
 * exited.
 */
#include "codebox-init.h"

#define MAX_LINE 256            /* a reply line, its newline included */
#define MAX_RESULT (1u << 20)   /* result bytes kept, whatever output_limit says: one R frame,
                                 * within the host's largest frame */
#define KILL_ROUNDS_MS 2000     /* how long the cell's processes may keep appearing */
#define DRAIN_MAX (4u << 20)    /* bytes read from each output pipe once the cell is over */
#define EOF_GRACE_MS 500        /* fd 4 closed: how long the driver has to be seen dead */
#define INTERRUPT_AGAIN_MS 250  /* an unanswered interrupt is sent again this often */

/* Linux's wait-status encoding (read back by WIFEXITED and co.), for ends the driver reports. */
#define EXITED(code) (((code) & 0xff) << 8)
#define SIGNALED(sig) ((sig) & 0x7f)

static struct {
    char **argv, **env;
    size_t nenv;
    uint64_t start_ms;
    const char *stdin_path;
    pid_t pid;                  /* 0: not running */
    int req, rep, out, err;     /* our ends of fds 3, 4, 1 and 2 */
    int fresh;                  /* no cell was sent since it started */
    int hwm;                    /* its high-water mark can be reset: peak_kb is measured */
} drv = { .req = -1, .rep = -1, .out = -1, .err = -1 };

static struct { char buf[CHUNK]; size_t len; int eof; } rb; /* replies read, not yet parsed */

void driver_init(char **argv, char **env, size_t nenv, uint64_t start_ms, const char *stdin_path)
{
    drv.argv = argv, drv.env = env, drv.nenv = nenv, drv.start_ms = start_ms;
    drv.stdin_path = stdin_path;
}

int driver_fresh(void)
{
    return drv.fresh;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void close_pipes(void)
{
    close_fd(&drv.req), close_fd(&drv.rep), close_fd(&drv.out), close_fd(&drv.err);
    rb.len = 0, rb.eof = 0;
}

/* ---- the processes of a cell ---- */

struct proc { pid_t pid, ppid; char state; };

/* Every process in /proc (this PID namespace's, as PID 1). */
static size_t scan_procs(struct proc **out)
{
    size_t n = 0, cap = 0;
    struct proc *v = NULL;
    struct dirent *e;
    DIR *d = opendir("/proc");
    while (d && (e = readdir(d)) != NULL) {
        char path[64], buf[512], *rp;
        struct proc p;
        int fd;
        if ((p.pid = atoi(e->d_name)) <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", p.pid);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[k > 0 ? k : 0] = 0;
        if (!(rp = strrchr(buf, ')')) || sscanf(rp + 1, " %c %d", &p.state, &p.ppid) != 2)
            continue;
        if (n == cap && !(v = realloc(v, (cap = cap * 2 + 64) * sizeof *v)))
            fatal("out of memory");
        v[n++] = p;
    }
    if (d)
        closedir(d);
    *out = v;
    return n;
}

/* Whether pid descends from `root` (following at most 64 parents). */
static int descends(const struct proc *v, size_t n, pid_t pid, pid_t root)
{
    for (int depth = 0; depth < 64 && pid > 1; depth++) {
        size_t i = 0;
        while (i < n && v[i].pid != pid)
            i++;
        if (i == n)
            return 0;
        if ((pid = v[i].ppid) == root)
            return 1;
    }
    return 0;
}

/* Kill every process but this one and `keep` (0: none), round after round until none is left,
 * reaping this process's children into acc (the status of `keep`, should it be reaped, goes
 * to *keep_status and *keep_done). As PID 1 that is every process of the container; otherwise
 * (tests, `docker run --init`) every descendant of this one, those of `keep` included.
 * Zombies are passed over: their parent reaps them. Returns -1 when processes were still
 * appearing after KILL_ROUNDS_MS (a driver that keeps forking). */
int kill_others(pid_t keep, struct reaped *acc, int *keep_status, int *keep_done)
{
    pid_t me = getpid();
    int64_t until = now_ns() + (int64_t)KILL_ROUNDS_MS * 1000000;
    for (;;) {
        struct proc *v;
        size_t n = scan_procs(&v);
        int found = 0;
        for (size_t i = 0; i < n; i++) {
            if (v[i].pid == me || v[i].pid == keep || v[i].state == 'Z' || v[i].state == 'X')
                continue;
            if (!is_init && !descends(v, n, v[i].pid, me))
                continue;
            kill(v[i].pid, SIGKILL);
            found++;
        }
        free(v);
        reap_all(keep, keep_status, keep_done, acc);
        if (!found)
            return 0;
        if (now_ns() > until)
            return -1;
        struct timespec pause = { 0, 2000000 };
        ppoll(NULL, 0, &pause, &wait_mask);
    }
}

/* ---- the driver's process ---- */

static int write_small(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = write_full(fd, text, strlen(text));
    close(fd);
    return rc;
}

/* Reset the driver's resident high-water mark (VmHWM), as `clear_refs` 5 does. */
static int reset_hwm(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)drv.pid);
    return write_small(path, "5");
}

/* The driver's VmHWM in kB, or 0. */
static long driver_hwm_kb(void)
{
    char path[64], buf[4096], *p;
    snprintf(path, sizeof path, "/proc/%d/status", (int)drv.pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    return (p = strstr(buf, "\nVmHWM:")) != NULL ? atol(p + 7) : 0;
}

/* CPU time so far of the driver (its own and its reaped children's, from /proc) plus every
 * process this one reaped, in microseconds. */
static int64_t cpu_now_us(void)
{
    struct rusage ru;
    int64_t us;
    getrusage(RUSAGE_CHILDREN, &ru);
    us = cpu_us(&ru);
    if (drv.pid > 0) {
        char path[64], buf[1024], *rp;
        unsigned long long ut, st, cut, cst;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)drv.pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        buf[n > 0 ? n : 0] = 0;
        static long hz;
        if (!hz)
            hz = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
        /* after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt
         * cmajflt utime stime cutime cstime */
        if ((rp = strrchr(buf, ')')) &&
            sscanf(rp + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu",
                   &ut, &st, &cut, &cst) == 4)
            us += (int64_t)((ut + st + cut + cst) * 1000000ULL / (unsigned long long)hz);
    }
    return us;
}

/* Reap ended children into acc; 1 when the driver was among them (its status in *status). */
static int reap_driver(struct reaped *acc, int *status)
{
    int done = 0;
    if (drv.pid <= 0)
        return 0;
    reap_all(drv.pid, status, &done, acc);
    if (done)
        drv.pid = 0;
    return done;
}

int driver_running(void)
{
    int status;
    reap_driver(NULL, &status);
    return drv.pid > 0;
}

/* Kill the driver and whatever it left; wait until it is reaped. */
void driver_stop(void)
{
    int status, done = 0;
    if (drv.pid > 0) {
        kill(drv.pid, SIGKILL);
        struct rusage ru;
        while (wait4(drv.pid, &status, 0, &ru) < 0 && errno == EINTR)
            ;
        drv.pid = 0;
    }
    kill_others(0, NULL, &status, &done);
    close_pipes();
}

static void describe(char *buf, size_t cap, int status)
{
    if (WIFEXITED(status))
        snprintf(buf, cap, "exited with code %d", WEXITSTATUS(status));
    else
        snprintf(buf, cap, "was killed by signal %d", WTERMSIG(status));
}

/* Read what fd 4 holds now, into rb; 1 when something was read. */
static int rb_fill(void)
{
    if (drv.rep < 0 || rb.eof || rb.len == sizeof rb.buf)
        return 0;
    ssize_t n = read(drv.rep, rb.buf + rb.len, sizeof rb.buf - rb.len);
    if (n > 0)
        rb.len += (size_t)n;
    else if (n == 0 || (errno != EAGAIN && errno != EINTR))
        rb.eof = 1;
    return n > 0;
}

/* The next reply line without its newline (at most MAX_LINE bytes with it), taken out of rb:
 * 1; 0 when it is not all there yet; -1 when it is too long. */
static int rb_line(char *line)
{
    size_t have = rb.len < MAX_LINE ? rb.len : MAX_LINE;
    char *nl = memchr(rb.buf, '\n', have);
    if (!nl)
        return rb.len >= MAX_LINE ? -1 : 0;
    size_t n = (size_t)(nl - rb.buf);
    memcpy(line, rb.buf, n);
    line[n] = 0;
    memmove(rb.buf, nl + 1, rb.len - n - 1);
    rb.len -= n + 1;
    return 1;
}

/* Keep the last bytes of what the driver wrote to stderr while starting, for the error. */
static void keep_tail(char *tail, size_t cap, size_t *len, const unsigned char *p, size_t n)
{
    if (n >= cap) {
        memcpy(tail, p + n - cap, cap);
        *len = cap;
        return;
    }
    size_t drop = *len + n > cap ? *len + n - cap : 0;
    memmove(tail, tail + drop, *len - drop);
    memcpy(tail + *len - drop, p, n);
    *len += n - drop;
}

/* Start the driver and wait until it says `ready` (within start_ms, 0: no limit). Its output
 * while starting is read and dropped; the end of its stderr goes into the error. -1 with the
 * reason in err_text. */
int driver_start(void)
{
    int o[2], e[2], q[2], r[2], rep[2], exec_errno = 0;
    close_pipes();
    if (pipe2(o, O_CLOEXEC) < 0 || pipe2(e, O_CLOEXEC) < 0 || pipe2(q, O_CLOEXEC) < 0 ||
        pipe2(r, O_CLOEXEC) < 0 || pipe2(rep, O_CLOEXEC) < 0)
        fatal("cannot create a pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        fatal("cannot fork: %s", strerror(errno));
    if (pid == 0) {
        /* Out of the way of fds 0 to 4 first, then into place. */
        int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
        int fq = fcntl(q[0], F_DUPFD_CLOEXEC, 10), fr = fcntl(r[1], F_DUPFD_CLOEXEC, 10);
        int frep = fcntl(rep[1], F_DUPFD_CLOEXEC, 10), fnul = fcntl(nul, F_DUPFD_CLOEXEC, 10);
        if (nul < 0 || fq < 0 || fr < 0 || frep < 0 || fnul < 0)
            _exit(127);
        child_setup(fnul, o[1], e[1]);
        setpgid(0, 0); /* a group of its own, whatever this process is: see interrupt() */
        if (dup2(fq, 3) != 3 || dup2(fr, 4) != 4)
            _exit(127);
        static char cell_stdin[MAX_PATH + 32];
        snprintf(cell_stdin, sizeof cell_stdin, "CODEBOX_CELL_STDIN=%s", drv.stdin_path);
        char **env = malloc((drv.nenv + 1) * sizeof *env);
        if (!env)
            _exit(127);
        memcpy(env, drv.env, drv.nenv * sizeof *env);
        env[drv.nenv] = cell_stdin;
        cfg.env = env, cfg.nenv = drv.nenv + 1;
        child_exec(drv.argv, frep);
    }
    setpgid(pid, pid); /* the child does too; whichever runs first */
    close(o[1]), close(e[1]), close(q[0]), close(r[1]), close(rep[1]);
    if (read(rep[0], &exec_errno, sizeof exec_errno) != (ssize_t)sizeof exec_errno)
        exec_errno = 0; /* end of file: exec succeeded */
    close(rep[0]);
    drv.pid = pid, drv.out = o[0], drv.err = e[0], drv.req = q[1], drv.rep = r[0];
    int fds[] = { drv.out, drv.err, drv.req, drv.rep };
    for (int i = 0; i < 4; i++)
        fcntl(fds[i], F_SETFL, O_NONBLOCK);
    if (exec_errno) {
        driver_stop();
        return fail("cannot run %s: %s", drv.argv[0], strerror(exec_errno));
    }

    char tail[512], line[MAX_LINE + 1], how[64];
    size_t tail_len = 0;
    int64_t eof_at = 0, deadline = drv.start_ms ? now_ns() + (int64_t)(drv.start_ms < 1000000000000ULL
                                                             ? drv.start_ms : 1000000000000ULL) * 1000000
                                    : 0;
    for (;;) {
        int status, got;
        if (reap_driver(NULL, &status)) {
            ssize_t n;
            while (drv.err >= 0 && (n = read(drv.err, iobuf, CHUNK)) > 0) /* its last words */
                keep_tail(tail, sizeof tail, &tail_len, iobuf, (size_t)n);
            describe(how, sizeof how, status);
            driver_stop();
            return fail("the driver %s before it said ready%s%.*s", how,
                        tail_len ? "; the end of its stderr: " : "", (int)tail_len, tail);
        }
        if ((got = rb_line(line)) != 0) {
            if (got == 1 && strcmp(line, "ready") == 0 && rb.len == 0)
                break;
            driver_stop();
            if (got == 1)
                return fail("the driver said `%.80s` instead of `ready`", line);
            return fail("the driver's first line is longer than %d bytes", MAX_LINE);
        }
        /* fd 4 closed: it is dying (then its status says more) or it broke the protocol */
        int64_t wake = rb.eof ? eof_at + (int64_t)EOF_GRACE_MS * 1000000 : deadline;
        if (rb.eof && !eof_at)
            eof_at = now_ns(), wake = eof_at + (int64_t)EOF_GRACE_MS * 1000000;
        if (rb.eof && now_ns() >= wake) {
            driver_stop();
            return fail("the driver closed fd 4 before it said ready");
        }
        if (deadline && deadline < wake)
            wake = deadline;
        struct timespec ts, *tp = NULL;
        if (wake) {
            int64_t left = wake - now_ns();
            if (deadline && now_ns() >= deadline) {
                driver_stop();
                return fail("the driver did not say ready within %llu ms",
                            (unsigned long long)drv.start_ms);
            }
            left = left > 0 ? left : 0;
            ts.tv_sec = left / 1000000000, ts.tv_nsec = left % 1000000000, tp = &ts;
        }
        struct pollfd p[3] = { { .fd = rb.eof ? -1 : drv.rep, .events = POLLIN },
                               { .fd = drv.out, .events = POLLIN },
                               { .fd = drv.err, .events = POLLIN } };
        if (ppoll(p, 3, tp, &wait_mask) <= 0)
            continue;
        if (p[0].revents)
            rb_fill();
        for (int i = 1; i < 3; i++) {
            ssize_t n = p[i].revents ? read(p[i].fd, iobuf, CHUNK) : -1;
            if (n > 0 && i == 2)
                keep_tail(tail, sizeof tail, &tail_len, iobuf, (size_t)n);
            if (n == 0) /* its end closed: poll it no more */
                p[i].fd = -1, close_fd(i == 1 ? &drv.out : &drv.err);
        }
    }
    drv.fresh = 1;
    drv.hwm = reset_hwm() == 0;
    return 0;
}

/* Before a cell: drop what the driver printed while no cell ran; -1 when it wrote on fd 4
 * (it broke the protocol: the caller starts it again). */
int driver_check_idle(void)
{
    int fds[2] = { drv.out, drv.err };
    for (int i = 0; i < 2; i++)
        for (size_t total = 0; fds[i] >= 0 && total < DRAIN_MAX;) {
            ssize_t n = read(fds[i], iobuf, CHUNK);
            if (n <= 0)
                break;
            total += (size_t)n;
        }
    rb_fill();
    return rb.len > 0 || rb.eof ? -1 : 0;
}

/* ---- a cell ---- */

struct run {
    const struct cell *c;
    struct cell_outcome *o;
    const char *phase;          /* "check", then "run" once the driver said `compiled` */
    struct stream s[2];         /* the output pipes, counted per phase */
    int64_t t0, cpu0, deadline, grace, again;
    long long oom_phase0, oom_cell0;
    struct reaped acc;          /* processes reaped during the phase */
    const char *end;            /* timed_out or stopped, once interrupted */
    int killed, dead, status;   /* the driver: killed by us; reaped, with its wait status */
    int over;                   /* the driver answered the cell (or broke the protocol) */
    int done_status;            /* the run phase's end as the driver reported it */
    int syntax;                 /* the cell did not parse */
    int compiled;               /* the driver said `compiled` */
    uint64_t payload_left;      /* bytes of a `syntax` or `result` reply still to read */
    int payload_result;         /* that payload is the result */
    char *result;
    size_t result_len, result_cap;
    char broken[200];           /* how the driver broke the protocol */
    int64_t eof_at;             /* when fd 4 was found closed before an answer */
    size_t sent;                /* bytes of the cell written to fd 3 */
    char head[64];
    size_t head_len;
};

static void phase_begin(struct run *r, const char *name, uint64_t timeout_ms)
{
    frame('P', name, strlen(name));
    r->phase = name;
    for (int i = 0; i < 2; i++)
        r->s[i].kept = r->s[i].total = 0;
    r->t0 = now_ns();
    r->cpu0 = cpu_now_us();
    r->oom_phase0 = cgroup_oom_kills();
    r->acc.cpu_us = 0;
    if (drv.pid > 0) /* else the dead driver's peak, reaped already, counts here too */
        r->acc.max_rss_kb = 0;
    if (drv.hwm && drv.pid > 0)
        reset_hwm();
    if (timeout_ms > 1000000000000ULL) /* 31 years: no overflow below */
        timeout_ms = 1000000000000ULL;
    r->deadline = timeout_ms ? r->t0 + (int64_t)timeout_ms * 1000000 : 0;
}

/* The X frame of the current phase: `end` when given (timed_out, stopped), else from the wait
 * status (the driver's own, or what its reply stands for). */
static void phase_end(struct run *r, int status, const char *end)
{
    char x[X_BYTES];
    size_t n = 0;
    long long oom = cgroup_oom_kills();
    int64_t cpu = cpu_now_us() - r->cpu0;
    oom_warning_once(r->oom_phase0, oom);
    x_end(x, sizeof x, &n, r->phase, status, end);
    appendf(x, sizeof x, &n, "wall_ms=%lld\n", (long long)((now_ns() - r->t0) / 1000000));
    appendf(x, sizeof x, &n, "cpu_ms=%lld\n", (long long)(cpu > 0 ? cpu / 1000 : 0));
    if (drv.hwm) {
        long peak = r->acc.max_rss_kb, hwm = drv.pid > 0 ? driver_hwm_kb() : 0;
        appendf(x, sizeof x, &n, "peak_kb=%ld\npeak_source=process\n", hwm > peak ? hwm : peak);
    }
    appendf(x, sizeof x, &n, "oom_kills=%lld\n",
            r->oom_phase0 < 0 || oom < 0 ? -1 : oom - r->oom_phase0);
    appendf(x, sizeof x, &n, "stdout_bytes=%llu\n", (unsigned long long)r->s[0].total);
    appendf(x, sizeof x, &n, "stderr_bytes=%llu\n", (unsigned long long)r->s[1].total);
    frame('X', x, n);
}

/* The driver broke the protocol: it is killed, and reported as exited. */
__attribute__((format(printf, 2, 3))) static void broken(struct run *r, const char *fmt, ...)
{
    va_list ap;
    if (r->broken[0] || r->dead)
        return;
    va_start(ap, fmt);
    vsnprintf(r->broken, sizeof r->broken, fmt, ap);
    va_end(ap);
    kill(drv.pid, SIGKILL);
    r->killed = r->over = 1;
}

/* Interrupt the cell (deadline or SIGTERM) as a terminal's Ctrl-C does: SIGINT to the driver's
 * process group, so that a program the cell waits for stops too and the cell cannot go on past
 * its deadline once that program is gone (a shell leaves a loop only when the command it waits
 * for died of SIGINT). The driver has interrupt_ms to answer; what the cell started is killed
 * when it ends, or, with the driver, when it does not answer in time. */
static void interrupt(struct run *r, const char *end)
{
    r->end = end;
    if (r->dead)
        return;
    kill(-drv.pid, SIGINT);
    uint64_t ms = r->c->interrupt_ms < 1000000000ULL ? r->c->interrupt_ms : 1000000000ULL;
    r->grace = now_ns() + (int64_t)ms * 1000000;
    r->again = now_ns() + (int64_t)INTERRUPT_AGAIN_MS * 1000000;
}

/* An interrupt not yet answered is sent again, until the driver answers or the grace ends: a
 * SIGINT can be lost to a race the shell cannot close (bash in a loop, hit while it forks the
 * next command, goes on looping about one time in ten). Drivers ignore SIGINT from their
 * answer on, so a repeat never reaches the next cell. */
static void interrupt_again(struct run *r, int64_t now)
{
    if (r->end && !r->killed && !r->dead && !r->over && now >= r->again && now < r->grace) {
        kill(-drv.pid, SIGINT);
        r->again = now + (int64_t)INTERRUPT_AGAIN_MS * 1000000;
    }
}

static void take_result(struct run *r, const char *p, size_t n)
{
    uint64_t cap = cfg.output_limit < MAX_RESULT ? cfg.output_limit : MAX_RESULT;
    r->o->result_bytes += n;
    if (r->result_len >= cap)
        return;
    if (n > cap - r->result_len)
        n = (size_t)(cap - r->result_len);
    if (r->result_len + n > r->result_cap) {
        size_t want = r->result_cap ? r->result_cap * 2 : 4096;
        while (want < r->result_len + n)
            want *= 2;
        if (!(r->result = realloc(r->result, r->result_cap = want)))
            fatal("out of memory");
    }
    memcpy(r->result + r->result_len, p, n);
    r->result_len += n;
}

/* One reply line. While the cell is interrupted any answer ends it (`compiled` then means
 * nothing more); otherwise `compiled` or `syntax` answer the check phase, `result` and `done`
 * the run phase. */
static void reply(struct run *r, const char *line)
{
    uint64_t len;
    int check = strcmp(r->phase, "check") == 0, n = 0;
    if (strcmp(line, "compiled") == 0 && check && !r->compiled) {
        r->compiled = 1;
        if (!r->end) {
            phase_end(r, EXITED(0), NULL);
            phase_begin(r, "run", r->c->timeout_ms);
        }
    } else if (sscanf(line, "syntax %*[0-9]%n", &n) == 0 && n == (int)strlen(line) && check &&
               !r->compiled && parse_u64(line + 7, strlen(line + 7), &len) == 0) {
        r->syntax = 1;
        r->payload_left = len, r->payload_result = 0;
        r->over = len == 0;
    } else if (sscanf(line, "result %*[0-9]%n", &n) == 0 && n == (int)strlen(line) &&
               (!check || r->compiled) && !r->o->has_result &&
               parse_u64(line + 7, strlen(line + 7), &len) == 0) {
        r->o->has_result = 1;
        r->payload_left = len, r->payload_result = 1;
    } else if (strcmp(line, "done ok") == 0 && (!check || r->end)) {
        r->done_status = EXITED(0), r->over = 1;
    } else if (strcmp(line, "done error") == 0 && (!check || r->end)) {
        r->done_status = EXITED(1), r->over = 1;
    } else if (strncmp(line, "done error ", 11) == 0 && (!check || r->end) &&
               parse_u64(line + 11, strlen(line + 11), &len) == 0 && len <= 255) {
        r->done_status = EXITED((int)len), r->over = 1;
    } else if (strcmp(line, "done interrupted") == 0 && (!check || r->end)) {
        /* unasked for, it is the cell's own SIGINT: reported as a death by SIGINT */
        r->done_status = SIGNALED(SIGINT), r->over = 1;
    } else {
        broken(r, "the driver replied `%.80s` %s", line,
               check ? "to a cell, not compiled or syntax" : "while the cell ran");
    }
}

/* Parse what rb holds: lines, and the payloads of `syntax` and `result`. */
static void replies(struct run *r)
{
    char line[MAX_LINE + 1];
    while (!r->broken[0]) {
        if (r->payload_left > 0) {
            size_t k = rb.len < r->payload_left ? rb.len : (size_t)r->payload_left;
            if (k == 0)
                break;
            if (r->payload_result)
                take_result(r, rb.buf, k);
            else
                relay(&r->s[1], rb.buf, k); /* the parser's message: the check's stderr */
            memmove(rb.buf, rb.buf + k, rb.len - k);
            rb.len -= k;
            r->payload_left -= k;
            if (r->payload_left == 0 && !r->payload_result)
                r->over = 1;
            continue;
        }
        if (r->over) {
            if (rb.len > 0)
                broken(r, "the driver wrote after its answer to the cell");
            else if (r->sent < r->head_len + r->c->code_len)
                broken(r, "the driver answered before it read the whole cell");
            break;
        }
        int got = rb_line(line);
        if (got < 0)
            broken(r, "the driver wrote a line longer than %d bytes", MAX_LINE);
        if (got <= 0)
            break;
        reply(r, line);
    }
    if (rb.eof && !r->over && !r->eof_at) /* broken unless it is dying (driver_run_cell) */
        r->eof_at = now_ns();
}

/* Write what fd 3 takes of `cell <number> <length>\n<code>`. */
static void send_cell(struct run *r)
{
    while (r->sent < r->head_len + r->c->code_len && drv.req >= 0) {
        const char *p = r->sent < r->head_len ? r->head + r->sent
                                              : r->c->code + (r->sent - r->head_len);
        size_t n = r->sent < r->head_len ? r->head_len - r->sent
                                         : r->c->code_len - (r->sent - r->head_len);
        ssize_t k = write(drv.req, p, n);
        if (k > 0) {
            r->sent += (size_t)k;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        broken(r, "the driver closed fd 3");
        return;
    }
}

/* Relay the output pipes until they are empty (or closed), at most DRAIN_MAX bytes each. */
static void drain(struct run *r)
{
    for (int i = 0; i < 2; i++)
        for (uint64_t before = r->s[i].total; r->s[i].fd >= 0 && r->s[i].total - before < DRAIN_MAX;)
            if (pump(&r->s[i]) < 0)
                break;
}

void driver_run_cell(const struct cell *c, struct cell_outcome *o)
{
    static struct run r;
    memset(&r, 0, sizeof r);
    memset(o, 0, sizeof *o);
    r.c = c, r.o = o;
    r.s[0] = (struct stream){ drv.out, 'O', 0, 0 };
    r.s[1] = (struct stream){ drv.err, 'E', 0, 0 };
    r.head_len = (size_t)snprintf(r.head, sizeof r.head, "cell %llu %zu\n",
                                  (unsigned long long)c->number, c->code_len);
    r.oom_cell0 = cgroup_oom_kills();
    drv.fresh = 0;
    rb.len = 0;
    phase_begin(&r, "check", c->check_timeout_ms);

    for (;;) {
        if (reap_driver(&r.acc, &r.status))
            r.dead = 1;
        if (r.dead || (r.over && !r.killed))
            break;
        int64_t now = now_ns(), wake = 0;
        if (!r.end && got_term)
            interrupt(&r, "stopped");
        else if (!r.end && r.deadline && now >= r.deadline)
            interrupt(&r, "timed_out");
        else if (r.end && !r.killed && now >= r.grace)
            kill(drv.pid, SIGKILL), r.killed = 1;
        else
            interrupt_again(&r, now);
        if (r.eof_at && !r.killed && now >= r.eof_at + (int64_t)EOF_GRACE_MS * 1000000)
            broken(&r, "the driver closed fd 4 and went on running");
        if (r.dead)
            break;
        wake = r.killed ? 0 : r.end ? (r.again < r.grace ? r.again : r.grace) : r.deadline;
        if (r.eof_at && !r.killed && (!wake || r.eof_at + (int64_t)EOF_GRACE_MS * 1000000 < wake))
            wake = r.eof_at + (int64_t)EOF_GRACE_MS * 1000000;

        struct pollfd p[4];
        nfds_t n = 0;
        if (drv.rep >= 0 && !rb.eof && rb.len < sizeof rb.buf && !r.killed)
            p[n++] = (struct pollfd){ .fd = drv.rep, .events = POLLIN };
        for (int i = 0; i < 2; i++)
            if (r.s[i].fd >= 0)
                p[n++] = (struct pollfd){ .fd = r.s[i].fd, .events = POLLIN };
        if (drv.req >= 0 && r.sent < r.head_len + c->code_len && !r.killed)
            p[n++] = (struct pollfd){ .fd = drv.req, .events = POLLOUT };
        struct timespec ts, *tp = NULL;
        if (wake) {
            int64_t left = wake - now_ns();
            left = left > 0 ? left : 0;
            ts.tv_sec = left / 1000000000, ts.tv_nsec = left % 1000000000, tp = &ts;
        }
        if (ppoll(p, n, tp, &wait_mask) <= 0)
            continue;
        /* Replies first: output read in the same round was written after them or with them,
         * so a cell's first output never lands in the check phase once `compiled` is read. */
        for (nfds_t i = 0; i < n; i++)
            if (p[i].fd == drv.rep && p[i].revents) {
                rb_fill();
                replies(&r);
            }
        for (nfds_t i = 0; i < n; i++)
            for (int j = 0; j < 2; j++)
                if (p[i].revents && p[i].fd == r.s[j].fd && p[i].events == POLLIN)
                    pump(&r.s[j]);
        for (nfds_t i = 0; i < n; i++)
            if (p[i].fd == drv.req && p[i].revents)
                send_cell(&r);
    }

    /* A driver that died on its own: what it said before counts (a `compiled` read late). */
    if (r.dead && !r.killed)
        while (rb_fill())
            replies(&r);

    /* The cell is over: the rest of its processes end, its output is read to the last byte. */
    if (!r.dead && kill_others(drv.pid, &r.acc, &r.status, &r.dead) < 0 && !r.dead) {
        broken(&r, "processes kept appearing for %d ms after the cell", KILL_ROUNDS_MS);
        struct rusage ru = { 0 };
        while (wait4(drv.pid, &r.status, 0, &ru) < 0 && errno == EINTR)
            ;
        r.acc.cpu_us += cpu_us(&ru);
        drv.pid = 0, r.dead = 1;
    }
    if (r.dead)
        kill_others(0, &r.acc, &r.status, &r.dead);
    drain(&r);
    drv.out = r.s[0].fd, drv.err = r.s[1].fd;

    if (r.end)
        phase_end(&r, 0, r.end);
    else if (r.dead)
        phase_end(&r, r.status, NULL);
    else if (r.syntax)
        phase_end(&r, EXITED(1), NULL);
    else
        phase_end(&r, r.done_status, NULL);
    if (r.broken[0])
        warnf("%s", r.broken);
    if (r.dead) {
        long long oom = cgroup_oom_kills();
        o->reset = 1;
        if (r.broken[0])
            o->reason = "driver_exited";
        else if (r.end)
            o->reason = strcmp(r.end, "stopped") == 0 ? "stopped" : "timed_out";
        else if (WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGKILL && r.oom_cell0 >= 0 &&
                 oom > r.oom_cell0)
            o->reason = "out_of_memory";
        else
            o->reason = "driver_exited";
        close_pipes();
    }
    o->stopped = r.end && strcmp(r.end, "stopped") == 0;
    if (o->has_result && !r.end && !r.dead && strcmp(r.phase, "run") == 0 &&
        r.done_status == EXITED(0)) {
        frame('R', r.result, r.result_len);
    } else {
        o->has_result = 0;
    }
    free(r.result);
}
