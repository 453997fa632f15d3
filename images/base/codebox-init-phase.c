/*
 * codebox-init: running a command as a phase (`check` or `run`): fork and exec it with its
 * output on pipes, relay the pipes as O and E frames until it exits, the deadline passes or
 * SIGTERM arrives, kill whatever else the phase started, reap everything and report how it
 * ended and what it used in an X frame.
 *
 * Safety: kill(-1, SIGKILL) is called only when this process is PID 1, that is inside the
 * container's own PID namespace, and only when nothing else is to survive (a run, a files-only
 * session: a session's driver is spared by kill_others in codebox-init-driver.c). Otherwise
 * (tests, `docker run --init`) each phase's command gets a process group of its own, and the
 * helper kills that group and its own children (it is a child subreaper, so orphans become its
 * children).
 */
#include "codebox-init.h"

/* The child's side of fork before its descriptors are set: default signals, a process group
 * of its own when not PID 1, dumpable, the OOM killer's first choice. */
void child_setup(int in, int out, int err)
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
    if (in >= 0 && in != 0 && dup2(in, 0) != 0)
        _exit(127);
    if (dup2(out, 1) != 1 || dup2(err, 2) != 2)
        _exit(127);
}

/* Exec argv with the environment plus cfg.env; a failure is reported as an errno on the
 * close-on-exec pipe `report`. */
void child_exec(char **argv, int report)
{
    for (size_t i = 0; i < cfg.nenv; i++)
        putenv(cfg.env[i]); /* PATH from an env record also applies to the lookup */
    execvpe(argv[0], argv, environ);
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

int64_t cpu_us(const struct rusage *r)
{
    return (int64_t)(r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1000000 +
           r->ru_utime.tv_usec + r->ru_stime.tv_usec;
}

/* Reap every child that has ended, adding each one's CPU and resident peak to acc (when
 * given); notes the status of `watch`. Returns -1 when no child is left. */
int reap_all(pid_t watch, int *status, int *watch_done, struct reaped *acc)
{
    int st;
    pid_t p;
    struct rusage ru;
    while ((p = wait4(-1, &st, WNOHANG, &ru)) > 0) {
        if (acc) {
            acc->cpu_us += cpu_us(&ru);
            if (ru.ru_maxrss > acc->max_rss_kb)
                acc->max_rss_kb = ru.ru_maxrss;
        }
        if (p == watch && watch > 0)
            *status = st, *watch_done = 1;
    }
    return p < 0 && errno == ECHILD ? -1 : 0;
}

/* Frame what of data is within output_limit for the stream; count all of it. */
void relay(struct stream *s, const void *data, size_t n)
{
    s->total += (uint64_t)n;
    if (s->kept < cfg.output_limit) {
        uint64_t k = cfg.output_limit - s->kept < (uint64_t)n ? cfg.output_limit - s->kept : (uint64_t)n;
        for (uint64_t off = 0; off < k; off += CHUNK)
            frame(s->kind, (const char *)data + off, k - off < CHUNK ? (size_t)(k - off) : CHUNK);
        s->kept += k;
    }
}

/* One read from a pipe, relayed. Returns 1 after data, 0 at end of file (the pipe is then
 * closed), -1 when nothing is there yet. */
int pump(struct stream *s)
{
    ssize_t n = read(s->fd, iobuf, CHUNK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return -1;
    if (n <= 0) {
        close(s->fd);
        s->fd = -1;
        return 0;
    }
    relay(s, iobuf, (size_t)n);
    return 1;
}

static int read_small(const char *path, char *buf, size_t cap)
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
    if (read_small("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", buf, sizeof buf) < 0 &&
        read_small("/sys/fs/cgroup/memory.peak", buf, sizeof buf) < 0)
        return -1;
    return buf[0] >= '0' && buf[0] <= '9' ? atoll(buf) : -1;
}

/* The memory cgroup's OOM kill count (v1 memory.oom_control, v2 memory.events), or -1. */
long long cgroup_oom_kills(void)
{
    char buf[1024], *p;
    if (read_small("/sys/fs/cgroup/memory/memory.oom_control", buf, sizeof buf) < 0 &&
        read_small("/sys/fs/cgroup/memory.events", buf, sizeof buf) < 0)
        return -1;
    for (p = buf; p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, "oom_kill ", 9) == 0)
            return atoll(p + 9);
    return -1;
}

void oom_warning_once(long long before, long long after)
{
    static int warned;
    if ((before < 0 || after < 0) && !warned++)
        warnf("the memory cgroup's OOM kill count is not readable: oom_kills is -1");
}

/* The `end` lines of an X frame: `end` when given (timed_out, stopped), else from the wait
 * status. */
void x_end(char *x, size_t cap, size_t *n, const char *phase, int status, const char *end)
{
    appendf(x, cap, n, "phase=%s\n", phase);
    if (end)
        appendf(x, cap, n, "end=%s\n", end);
    else if (WIFEXITED(status))
        appendf(x, cap, n, "end=exited\ncode=%d\n", WEXITSTATUS(status));
    else
        appendf(x, cap, n, "end=signaled\nsignal=%d\n", WTERMSIG(status));
}

/* The handshake of a run command that checks its source itself (check_in_run): it writes
 * `compiled\n` on fd 3 once its check passed, then reads `run\n` on fd 4 before any of the
 * program runs, so that what the check wrote and what the program writes never mix. */
#define SAID_COMPILED "compiled\n"
#define ANSWER_RUN "run\n"

struct handshake {
    int from, to;                      /* our ends: fd 3's pipe (read), fd 4's pipe (write) */
    char got[sizeof SAID_COMPILED - 1];
    size_t n;
};

/* In the child: the handshake's ends as fds 3 and 4, inherited by the command. */
static void handshake_child(int up, int down)
{
    /* Above 10 first, so that neither lands on the other's target. */
    int u = fcntl(up, F_DUPFD_CLOEXEC, 10), d = fcntl(down, F_DUPFD_CLOEXEC, 10);
    if (u < 0 || d < 0 || dup2(u, 3) != 3 || dup2(d, 4) != 4)
        _exit(127);
}

/* Read what the command said on fd 3: 1 once it said `compiled`, 0 while not yet (or after it
 * closed fd 3 without a word), -1 when it said something else. */
static int handshake_read(struct handshake *h)
{
    while (h->from >= 0 && h->n < sizeof h->got) {
        ssize_t k = read(h->from, h->got + h->n, sizeof h->got - h->n);
        if (k < 0)
            return 0; /* EAGAIN, EINTR: nothing yet */
        if (k == 0) {
            close(h->from);
            h->from = -1;
            return 0;
        }
        h->n += (size_t)k;
        if (memcmp(h->got, SAID_COMPILED, h->n) != 0)
            return -1;
    }
    return h->n == sizeof h->got;
}

/* The CPU time of a process that is still running (its threads', not its children's), in
 * microseconds; 0 when it cannot be read. */
static int64_t process_cpu_us(pid_t pid)
{
    clockid_t clock;
    struct timespec t;
    if (clock_getcpuclockid(pid, &clock) == 0 && clock_gettime(clock, &t) == 0)
        return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
    char path[64], buf[1024], *rp;
    unsigned long ut, st;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0 || read_small(path, buf, sizeof buf) < 0 || !(rp = strrchr(buf, ')')) ||
        sscanf(rp + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (int64_t)(ut + st) * 1000000 / hz;
}

/* What a phase is, while it runs: its name, start, deadline and the figures its X reports as
 * differences from these. */
struct phase {
    const char *name;
    int64_t t0, deadline;
    long long oom0;
    int64_t cpu0_us; /* CPU already counted for earlier phases of the same command */
};

static void phase_begin(struct phase *ph, const char *name, uint64_t timeout_ms,
                        int64_t cpu0_us)
{
    if (timeout_ms > 1000000000000ULL) /* 31 years: no overflow below */
        timeout_ms = 1000000000000ULL;
    frame('P', name, strlen(name));
    ph->name = name;
    ph->t0 = now_ns();
    ph->deadline = timeout_ms ? ph->t0 + (int64_t)timeout_ms * 1000000 : 0;
    ph->oom0 = cgroup_oom_kills();
    ph->cpu0_us = cpu0_us;
}

/* The X frame of a phase: how it ended (`status`, or `end`, or `error`) and what it used. */
static void phase_end(const struct phase *ph, int64_t ended, int status, const char *end,
                      const char *error, int64_t cpu_us_total, long max_rss_kb, struct stream s[2])
{
    long long peak = in_session ? -1 : cgroup_peak(), oom1 = cgroup_oom_kills();
    static int warned_peak;
    if (!in_session && peak < 0 && !warned_peak++)
        warnf("the memory cgroup is not readable: peak_kb is the largest process's resident set");
    oom_warning_once(ph->oom0, oom1);
    char x[X_BYTES];
    size_t n = 0;
    if (error) {
        x_end(x, sizeof x, &n, ph->name, 0, "error");
        appendf(x, sizeof x, &n, "error=%s\n", error);
    } else {
        x_end(x, sizeof x, &n, ph->name, status, end);
    }
    appendf(x, sizeof x, &n, "wall_ms=%lld\n", (long long)((ended - ph->t0) / 1000000));
    appendf(x, sizeof x, &n, "cpu_ms=%lld\n", (long long)((cpu_us_total - ph->cpu0_us) / 1000));
    if (in_session)
        appendf(x, sizeof x, &n, "peak_kb=%ld\npeak_source=process\n", max_rss_kb);
    else
        appendf(x, sizeof x, &n, "peak_kb=%lld\npeak_source=%s\n",
                peak >= 0 ? peak / 1024 : (long long)max_rss_kb, peak >= 0 ? "cgroup" : "rusage");
    appendf(x, sizeof x, &n, "oom_kills=%lld\n",
            ph->oom0 < 0 || oom1 < 0 ? -1 : oom1 - ph->oom0);
    appendf(x, sizeof x, &n, "stdout_bytes=%llu\n", (unsigned long long)s[0].total);
    appendf(x, sizeof x, &n, "stderr_bytes=%llu\n", (unsigned long long)s[1].total);
    frame('X', x, n);
}

/* Run one command as one phase (`name`), or with `checked` as the check phase and then the
 * run phase (run_checked). Writes the P, O, E and X frames. Returns 1 when the command exited
 * with code 0 (and, checked, after it said `compiled`). In a session the peak is that of the
 * phase's own processes (the cgroup's high-water mark cannot be reset and covers the whole
 * session). */
static int run_command(const char *name, char **argv, int in, uint64_t timeout_ms, int checked,
                       uint64_t run_timeout_ms)
{
    int out[2], err[2], rep[2], up[2] = { -1, -1 }, down[2] = { -1, -1 };
    int status = 0, done = 0, exec_errno = 0;
    struct rusage ru0, ru1;
    struct reaped acc = { 0, 0 };
    struct phase ph;
    struct handshake hs = { -1, -1, { 0 }, 0 };
    const char *error = NULL;
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(rep, O_CLOEXEC) < 0 ||
        (checked && (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0)))
        fatal("cannot create a pipe: %s", strerror(errno));
    getrusage(RUSAGE_CHILDREN, &ru0);
    phase_begin(&ph, name, timeout_ms, 0);
    pid_t pid = fork();
    if (pid < 0)
        fatal("cannot fork: %s", strerror(errno));
    if (pid == 0) {
        child_setup(in, out[1], err[1]);
        if (checked)
            handshake_child(up[1], down[0]);
        child_exec(argv, rep[1]);
    }
    if (!is_init)
        setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    close(rep[1]);
    if (checked) {
        close(up[1]);
        close(down[0]);
        hs.from = up[0], hs.to = down[1];
        fcntl(hs.from, F_SETFL, O_NONBLOCK);
        fcntl(hs.to, F_SETFL, O_NONBLOCK);
    }
    if (read(rep[0], &exec_errno, sizeof exec_errno) != (ssize_t)sizeof exec_errno)
        exec_errno = 0; /* end of file: exec succeeded */
    close(rep[0]);
    struct stream s[2] = { { out[0], 'O', 0, 0 }, { err[0], 'E', 0, 0 } };
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);

    /* Relay until the main process exits, the deadline passes or SIGTERM arrives. */
    const char *end = NULL;
    for (;;) {
        reap_all(pid, &status, &done, &acc);
        if (done)
            break;
        if (got_term) {
            end = "stopped";
            break;
        }
        int said = checked ? handshake_read(&hs) : 0;
        if (said < 0) {
            error = "the run command wrote something other than `compiled` on fd 3";
            break;
        }
        if (said > 0) {
            /* The check passed and the program waits for our answer: what the pipes hold is
             * the check's. End the check phase and begin the run phase. */
            for (int i = 0; i < 2; i++)
                while (s[i].fd >= 0 && pump(&s[i]) > 0) {}
            struct rusage now;
            getrusage(RUSAGE_CHILDREN, &now);
            int64_t cpu = cpu_us(&now) - cpu_us(&ru0) + process_cpu_us(pid);
            phase_end(&ph, now_ns(), 0, NULL, NULL, cpu, now.ru_maxrss, s);
            for (int i = 0; i < 2; i++)
                s[i].kept = s[i].total = 0;
            acc.max_rss_kb = 0;
            phase_begin(&ph, "run", run_timeout_ms, cpu);
            checked = 0;
            if (hs.from >= 0)
                close(hs.from);
            if (write(hs.to, ANSWER_RUN, strlen(ANSWER_RUN)) < 0) { /* it will see the end */ }
            close(hs.to);
            hs.from = hs.to = -1;
            continue;
        }
        struct timespec ts, *tp = NULL;
        if (ph.deadline) {
            int64_t left = ph.deadline - now_ns();
            if (left <= 0) {
                end = "timed_out";
                break;
            }
            ts.tv_sec = left / 1000000000, ts.tv_nsec = left % 1000000000, tp = &ts;
        }
        struct pollfd p[3];
        nfds_t n = 0;
        for (int i = 0; i < 2; i++)
            if (s[i].fd >= 0)
                p[n++] = (struct pollfd){ .fd = s[i].fd, .events = POLLIN };
        if (hs.from >= 0)
            p[n++] = (struct pollfd){ .fd = hs.from, .events = POLLIN };
        if (ppoll(p, n, tp, &wait_mask) > 0)
            for (nfds_t i = 0; i < n; i++)
                if (p[i].revents && p[i].fd != hs.from)
                    pump(s[0].fd == p[i].fd ? &s[0] : &s[1]);
    }

    int64_t ended = now_ns();

    /* Kill the rest, reap everything, then drain what the pipes still hold. */
    for (;;) {
        kill_rest(pid);
        if (reap_all(pid, &status, &done, &acc) < 0)
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
    if (hs.from >= 0)
        close(hs.from);
    if (hs.to >= 0)
        close(hs.to);

    getrusage(RUSAGE_CHILDREN, &ru1);
    char why[MAX_PATH / 2 + 128];
    if (exec_errno) {
        char arg0[MAX_PATH / 2];
        snprintf(arg0, sizeof arg0, "%s", argv[0]);
        for (char *c = arg0; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?'; /* one line per key */
        snprintf(why, sizeof why, "cannot run %s: %s", arg0, strerror(exec_errno));
        error = why;
    } else if (checked && !error && !end && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        error = "the run command exited without saying `compiled` on fd 3";
    }
    long rss = in_session ? acc.max_rss_kb : ru1.ru_maxrss;
    phase_end(&ph, ended, status, end, error, cpu_us(&ru1) - cpu_us(&ru0), rss, s);
    return !error && !end && !checked && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int run_phase(const char *name, char **argv, int in, uint64_t timeout_ms)
{
    return run_command(name, argv, in, timeout_ms, 0, 0);
}

/* The check and the program in one process: the check phase (check_timeout_ms) lasts until
 * the command says `compiled`, the run phase (timeout_ms) from then on. A command that ends
 * before it said so ended its check: its exit status is the check's (non-zero: the check
 * failed), and no run phase follows. */
int run_checked(char **argv, int in, uint64_t check_timeout_ms, uint64_t timeout_ms)
{
    return run_command("check", argv, in, check_timeout_ms, 1, timeout_ms);
}
