/*
 * codebox-init: what its files share. docs/sandbox-init.md specifies the protocol and the
 * behaviour; each .c file has one job:
 *   codebox-init.c          main, signals, frames and messages, the one-shot run
 *   codebox-init-sha256.c   SHA-256 and its self-test
 *   codebox-init-records.c  reading records from stdin (never past a payload or request) and
 *                           laying out the files they name
 *   codebox-init-phase.c    running a command as a phase: relay, deadline, kill, reap, usage
 *   codebox-init-files.c    files back: the F and B frames of outputs/ or the workspace
 *   codebox-init-session.c  session mode: the opening, requests, files-only executions, reads
 *   codebox-init-driver.c   session mode: the driver, its line protocol and the cells
 *   codebox-init-egress.c   the egress relay: the container's loopback to codebox's proxy
 */
#ifndef CODEBOX_INIT_H
#define CODEBOX_INIT_H

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

#define CHUNK 65536             /* largest O, E, R or B frame payload; read size */
#define MAX_PATH 4096           /* longest path or link target */
#define MAX_RECORD (1u << 20)   /* largest record kept in memory (all but a file's content) */
#define MAX_KEPT (8u << 20)     /* all records of a payload or request kept in memory */
#define MAX_DEPTH 16            /* levels listed below outputs/ or the working directory */
#define MAX_LISTED 1000         /* entries listed in `outputs` mode, folders included */
#define MAX_WORKSPACE 100000    /* entries in `workspace-on-success` mode */
#define MAX_COUNTED 1000000     /* entries counted, not listed, past MAX_LISTED */
#define STR_(x) #x
#define STR(x) STR_(x)
#ifndef X_BYTES                 /* an X frame's text (tests/init/check.sh builds it smaller) */
#define X_BYTES (MAX_PATH + 1024)
/* ---- codebox-init-egress.c ---- */
#define EGRESS_ENV "CODEBOX_EGRESS"
/* Start the relay when EGRESS_ENV is set (and remove it from the environment); 0 when it is
 * absent or the relay runs, -1 with err_text. */
int egress_start(void);
int egress_selftest(void);

#endif

extern char **environ;

enum { C_NONE, C_OUTPUTS, C_WORKSPACE };

/* What the current run or execution asks for (defaults in codebox-init.c). */
struct config {
    char **check, **run, **env;
    size_t nenv, kept;
    uint64_t check_timeout_ms, timeout_ms, output_limit, max_files, max_bytes, max_file_bytes;
    uint64_t check_in_run; /* 1: the run command checks the source itself (fds 3 and 4) */
    int collect;
};
extern struct config cfg;
extern const struct config cfg_defaults;

extern int is_init;       /* PID 1 of the container's PID namespace */
extern int in_session;    /* a session record opened the payload */
extern int out_broken;    /* stdout failed: nothing more is written */
extern volatile sig_atomic_t got_term;
extern sigset_t wait_mask; /* the signal mask while waiting: SIGCHLD and SIGTERM let through */
extern unsigned char iobuf[CHUNK];

/* ---- codebox-init.c: frames and messages ---- */
int write_full(int fd, const void *buf, size_t len);
void frame(char kind, const void *data, size_t len);
void vmessage(char kind, const char *fmt, va_list ap);
__attribute__((format(printf, 1, 2))) void warnf(const char *fmt, ...);
__attribute__((format(printf, 1, 2), noreturn)) void fatal(const char *fmt, ...);
__attribute__((format(printf, 4, 5))) int appendf(char *buf, size_t cap, size_t *n,
                                                  const char *fmt, ...);
void *xmalloc(size_t n);
/* A failure a session survives: the text goes to err_text (one line), the caller gets -1. */
extern char err_text[2 * MAX_PATH + 256];
__attribute__((format(printf, 1, 2))) int fail(const char *fmt, ...);
int64_t now_ns(void);

/* ---- codebox-init-sha256.c ---- */
struct sha256 { uint32_t h[8]; uint64_t len; unsigned char buf[64]; size_t n; };
void sha_init(struct sha256 *s);
void sha_update(struct sha256 *s, const void *data, size_t len);
void sha_bytes(struct sha256 *s, unsigned char out[32]);
void sha_hex(struct sha256 *s, char out[65]);
int selftest(void);

/* ---- codebox-init-records.c ---- */
/* Record names. env, dir, file and link may repeat; every other record appears at most once
 * per payload or request. Decimal values from R_NUMBERS on. */
enum {
    R_ENV, R_DIR, R_FILE, R_LINK, R_END, R_CHECK, R_RUN, R_COLLECT, R_SESSION, R_EXEC,
    R_READ, R_CELL, R_STDIN, R_PATH, R_NUMBERS,
    R_CHECK_TIMEOUT_MS = R_NUMBERS, R_TIMEOUT_MS, R_OUTPUT_LIMIT, R_MAX_FILES, R_MAX_BYTES,
    R_MAX_FILE_BYTES, R_RESET, R_INTERRUPT_MS, R_OFFSET, R_EXECUTION_COUNT, R_CHECK_IN_RUN,
    R_COUNT
};
extern const char *const rec_names[R_COUNT];
extern int in_idle; /* session: waiting for a request's first byte (see in_need) */
void read_magic(void);
int next_record(char *name, size_t cap, uint64_t *len);
void in_take(void *dst, size_t n);
void in_skip(uint64_t n);
void in_check_drained(const char *rec);
int parse_u64(const char *s, size_t n, uint64_t *out);
int check_path(const char *p, size_t n, const char *rec);
int open_dir_at(int dfd, const char *name);
char **parse_argv(char *v, size_t len, const char *rec);
int rec_dir(char *v, size_t len);
int rec_link(char *v, size_t len);
int rec_file(uint64_t len);
int rec_stdin(uint64_t len, const char *path);
int write_empty(const char *path);

/* ---- codebox-init-phase.c ---- */
struct reaped { int64_t cpu_us; long max_rss_kb; };
struct stream { int fd; char kind; uint64_t kept, total; };
int reap_all(pid_t watch, int *status, int *watch_done, struct reaped *acc);
void child_setup(int in, int out, int err);
__attribute__((noreturn)) void child_exec(char **argv, int report);
int run_phase(const char *name, char **argv, int in, uint64_t timeout_ms);
int run_checked(char **argv, int in, uint64_t check_timeout_ms, uint64_t timeout_ms);
void relay(struct stream *s, const void *data, size_t n);
int pump(struct stream *s);
long long cgroup_oom_kills(void);
void oom_warning_once(long long before, long long after);
int64_t cpu_us(const struct rusage *r);
void x_end(char *x, size_t cap, size_t *n, const char *phase, int status, const char *end);

/* ---- codebox-init-files.c ---- */
void collect(int run_ok);
void entry(const char *kind, const char *path, unsigned mode, uint64_t size, const char *sha,
           const char *reason, const char *target);
/* Session: the SHA-256 last returned or uploaded, per path under outputs/ (at most
 * MAX_REMEMBERED paths). */
#define MAX_REMEMBERED 10000
void remember(const char *path, const unsigned char sha[32]);
/* The first `keep` names by strcmp among those added (a max-heap), the rest counted. */
struct heap_names { char **v; size_t n, cap, keep; uint64_t dropped; };
char *names_add(struct heap_names *h, const char *name);
void names_sort(struct heap_names *h);
void names_free(struct heap_names *h);

/* ---- codebox-init-session.c ---- */
__attribute__((noreturn)) void session_main(char **driver_argv, uint64_t start_timeout_ms);

/* ---- codebox-init-driver.c ---- */
struct cell {
    const char *code;
    size_t code_len;
    uint64_t number, check_timeout_ms, timeout_ms, interrupt_ms;
};
struct cell_outcome {
    int reset;                /* the interpreter was lost (and is to be started again) */
    const char *reason;       /* why: timed_out, stopped, out_of_memory, driver_exited */
    int stopped;              /* SIGTERM ended it: no files are collected */
    int has_result;           /* an R frame was written */
    uint64_t result_bytes;    /* the result's size before the cap */
};
void driver_init(char **argv, char **env, size_t nenv, uint64_t start_ms, const char *stdin_path);
int driver_start(void);
int driver_running(void);
int driver_fresh(void);
int driver_check_idle(void);
void driver_stop(void);
void driver_run_cell(const struct cell *c, struct cell_outcome *o);
int kill_others(pid_t keep, struct reaped *acc, int *keep_status, int *keep_done);

/* ---- codebox-init-egress.c ---- */
#define EGRESS_ENV "CODEBOX_EGRESS"
/* Start the relay when EGRESS_ENV is set (and remove it from the environment); 0 when it is
 * absent or the relay runs, -1 with err_text. */
int egress_start(void);
int egress_selftest(void);

#endif
