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

/* Run one phase and write its P, O, E and X frames. Returns 1 when it exited with code 0.
 * In a session the peak is that of the phase's own processes (the cgroup's high-water mark
 * cannot be reset and covers the whole session). */
int run_phase(const char *name, char **argv, int in, uint64_t timeout_ms)
{
    int out[2], err[2], rep[2], status = 0, done = 0, exec_errno = 0;
    struct rusage ru0, ru1;
    struct reaped acc = { 0, 0 };
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
    if (pid == 0) {
        child_setup(in, out[1], err[1]);
        child_exec(argv, rep[1]);
    }
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
        reap_all(pid, &status, &done, &acc);
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

    getrusage(RUSAGE_CHILDREN, &ru1);
    long long peak = in_session ? -1 : cgroup_peak(), oom1 = cgroup_oom_kills();
    static int warned_peak;
    if (!in_session && peak < 0 && !warned_peak++)
        warnf("the memory cgroup is not readable: peak_kb is the largest process's resident set");
    oom_warning_once(oom0, oom1);

    char x[X_BYTES], arg0[MAX_PATH / 2];
    size_t n = 0;
    if (exec_errno) {
        snprintf(arg0, sizeof arg0, "%s", argv[0]);
        for (char *c = arg0; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?'; /* one line per key */
        x_end(x, sizeof x, &n, name, 0, "error");
        appendf(x, sizeof x, &n, "error=cannot run %s: %s\n", arg0, strerror(exec_errno));
    } else {
        x_end(x, sizeof x, &n, name, status, end);
    }
    appendf(x, sizeof x, &n, "wall_ms=%lld\n", (long long)wall_ms);
    appendf(x, sizeof x, &n, "cpu_ms=%lld\n", (long long)((cpu_us(&ru1) - cpu_us(&ru0)) / 1000));
    if (in_session)
        appendf(x, sizeof x, &n, "peak_kb=%ld\npeak_source=process\n", acc.max_rss_kb);
    else
        appendf(x, sizeof x, &n, "peak_kb=%lld\npeak_source=%s\n",
                peak >= 0 ? peak / 1024 : (long long)ru1.ru_maxrss, peak >= 0 ? "cgroup" : "rusage");
    appendf(x, sizeof x, &n, "oom_kills=%lld\n", oom0 < 0 || oom1 < 0 ? -1 : oom1 - oom0);
    appendf(x, sizeof x, &n, "stdout_bytes=%llu\n", (unsigned long long)s[0].total);
    appendf(x, sizeof x, &n, "stderr_bytes=%llu\n", (unsigned long long)s[1].total);
    frame('X', x, n);
    return !exec_errno && !end && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
