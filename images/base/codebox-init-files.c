/*
 * codebox-init: files back. After the program, the F and B frames of what it left under
 * outputs/ (sorted, at most MAX_DEPTH levels and MAX_LISTED entries, symbolic links never
 * followed) or of the whole working directory (`workspace-on-success`, the compile stage's
 * artifacts). In a session, only what changed: a table remembers the SHA-256 of what was
 * returned or uploaded under outputs/, and an entry whose content matches it is passed over.
 */
#include "codebox-init.h"

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

/* ---- the session's table: path -> SHA-256 of what was last returned or uploaded ---- */

/* Keys and values are digests (of the path, of the content), so an entry takes 65 bytes
 * whatever the path's length: 16384 slots, at most MAX_REMEMBERED used, about 1 MiB. A path
 * past the cap is not remembered and so is returned whenever it is listed. */
#define SLOTS 16384
static struct slot { unsigned char key[32], val[32], used; } table[SLOTS];
static size_t table_used;

static struct slot *slot_of(const char *path, int insert)
{
    unsigned char key[32];
    struct sha256 h;
    sha_init(&h);
    sha_update(&h, path, strlen(path));
    sha_bytes(&h, key);
    size_t i = ((size_t)key[0] << 8 | key[1]) % SLOTS;
    for (;; i = (i + 1) % SLOTS) {
        if (!table[i].used) {
            if (!insert || table_used >= MAX_REMEMBERED)
                return NULL;
            table_used++;
            table[i].used = 1;
            memcpy(table[i].key, key, 32);
            return &table[i];
        }
        if (memcmp(table[i].key, key, 32) == 0)
            return &table[i];
    }
}

void remember(const char *path, const unsigned char sha[32])
{
    struct slot *s = slot_of(path, 1);
    if (s)
        memcpy(s->val, sha, 32);
}

static int known(const char *path, const unsigned char sha[32])
{
    struct slot *s = slot_of(path, 0);
    return s && memcmp(s->val, sha, 32) == 0;
}

/* What an entry is remembered by: a regular file's content; for a symbolic link its target
 * and for any other kind of file its kind, each with a prefix no content digest can share.
 * -1 when it cannot be read (it is then listed every time). */
static int digest_of(int dfd, const char *name, const struct stat *st, unsigned char out[32])
{
    struct sha256 h;
    sha_init(&h);
    if (S_ISLNK(st->st_mode)) {
        char target[MAX_PATH + 1];
        ssize_t n = readlinkat(dfd, name, target, MAX_PATH);
        if (n < 0)
            return -1;
        sha_update(&h, "\0link\0", 6);
        sha_update(&h, target, (size_t)n);
    } else if (!S_ISREG(st->st_mode)) {
        sha_update(&h, "\0other\0", 7);
    } else {
        struct stat fst;
        ssize_t n;
        int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &fst) < 0 || !S_ISREG(fst.st_mode)) {
            if (fd >= 0)
                close(fd);
            return -1;
        }
        while ((n = read(fd, iobuf, CHUNK)) > 0)
            sha_update(&h, iobuf, (size_t)n);
        close(fd);
        if (n < 0)
            return -1;
    }
    sha_bytes(&h, out);
    return 0;
}

/* Session, outputs: whether the entry `name` of dfd (in the folder w->path[0..plen)) is what
 * was last returned or uploaded. Folders are never passed over. */
static int unchanged(struct walk *w, int dfd, const char *name, size_t plen)
{
    struct stat st;
    unsigned char sha[32];
    char path[MAX_PATH + 2];
    if (!in_session || w->workspace || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
        S_ISDIR(st.st_mode) || plen + 1 + strlen(name) > MAX_PATH)
        return 0;
    if (plen)
        snprintf(path, sizeof path, "%.*s/%s", (int)plen, w->path, name);
    else
        snprintf(path, sizeof path, "%s", name);
    return digest_of(dfd, name, &st, sha) == 0 && known(path, sha);
}

/* Session: remember an entry once it was returned. */
static void returned(struct walk *w, int dfd, const char *name, const struct stat *st)
{
    unsigned char sha[32];
    if (in_session && !w->workspace && digest_of(dfd, name, st, sha) == 0)
        remember(w->path, sha);
}

/* ---- the walk ---- */

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

void entry(const char *kind, const char *path, unsigned mode, uint64_t size, const char *sha,
           const char *reason, const char *target)
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
    returned(w, dfd, name, st);
}

static void send_file(struct walk *w, int dfd, const char *name, const struct stat *lst)
{
    char hex[65] = "", reason[128] = "";
    struct stat st;
    struct sha256 h;
    uint64_t size = 0;
    ssize_t n;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int stat_ok = fd >= 0 && fstat(fd, &st) == 0;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
        if (fd < 0 && errno != ELOOP)
            snprintf(reason, sizeof reason, "not readable: %s", strerror(errno));
        entry("f", w->path, lst->st_mode & 07777, (uint64_t)lst->st_size, "",
              reason[0] ? reason : "not a regular file", "");
        if (stat_ok)
            returned(w, dfd, name, &st);
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
    unsigned char digest[32];
    sha_bytes(&h, digest);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    int remembered = 0;
    if (!w->workspace) {
        if (size > cfg.max_file_bytes) {
            snprintf(reason, sizeof reason, "over the %llu-byte per-file cap",
                     (unsigned long long)cfg.max_file_bytes);
            remembered = 1; /* it will not fit next time either: said once */
        } else if (w->files >= cfg.max_files) {
            snprintf(reason, sizeof reason, "over the %llu-file cap",
                     (unsigned long long)cfg.max_files);
        } else if (size > cfg.max_bytes - w->bytes) {
            snprintf(reason, sizeof reason, "over the %llu-byte total cap",
                     (unsigned long long)cfg.max_bytes);
        } else {
            w->files++, w->bytes += size, remembered = 1;
        }
    }
    entry("f", w->path, st.st_mode & 07777, size, hex, reason, "");
    for (uint64_t off = 0; !reason[0] && off < size; off += (uint64_t)n) {
        size_t want = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
        n = pread(fd, iobuf, want, (off_t)off);
        if (n <= 0 && !in_session)
            fatal("%s changed while it was being sent", w->path);
        if (n <= 0) { /* a session's driver may still be running: pad, do not die */
            warnf("%s changed while it was being sent", w->path);
            memset(iobuf, 0, want);
            n = (ssize_t)want;
        }
        frame('B', iobuf, (size_t)n);
    }
    if (in_session && remembered)
        remember(w->path, digest);
    close(fd);
}

/* ---- names kept in order, within a cap ---- */

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

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        fatal("out of memory");
    return d;
}

/* Keep `name` if it is among the first h->keep names by strcmp seen so far. Returns the name
 * that is not kept (this one, or the greatest kept one it displaced), for the caller to count
 * and free, or NULL. */
char *names_add(struct heap_names *h, const char *name)
{
    if (h->n < h->keep) {
        if (h->n == h->cap && !(h->v = realloc(h->v, (h->cap = h->cap * 2 + 16) * sizeof *h->v)))
            fatal("out of memory");
        h->v[h->n] = xstrdup(name);
        heap_up(h->v, h->n++);
        return NULL;
    }
    h->dropped++;
    if (h->n > 0 && strcmp(name, h->v[0]) < 0) { /* it goes before the greatest kept */
        char *out = h->v[0];
        h->v[0] = xstrdup(name);
        heap_down(h->v, h->n, 0);
        return out;
    }
    return xstrdup(name);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void names_sort(struct heap_names *h)
{
    qsort(h->v, h->n, sizeof *h->v, by_name);
}

void names_free(struct heap_names *h)
{
    for (size_t i = 0; i < h->n; i++)
        free(h->v[i]);
    free(h->v);
    memset(h, 0, sizeof *h);
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
    int fd = open_dir_at(dfd, name);
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
 * stays bounded whatever the folder holds, and the others are counted as not listed. In a
 * session, entries that did not change are passed over before they count.
 * Workspace: every name is kept, up to MAX_WORKSPACE entries in all. */
static void walk(struct walk *w, int dfd, size_t plen, int depth)
{
    struct heap_names names = { .keep = w->workspace ? SIZE_MAX : (size_t)(MAX_LISTED - w->listed) };
    struct dirent *e;
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* an offset of its own */
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        problem(w, "%s: cannot be listed: %s", plen ? w->path : ".", strerror(errno));
        return;
    }
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || unchanged(w, dfd, name, plen))
            continue;
        if (w->workspace && ++w->listed > MAX_WORKSPACE)
            fatal("the compile stage left more than %d entries", MAX_WORKSPACE);
        char *out = names_add(&names, name);
        if (out) {
            count_unlisted(w, dfd, out, depth);
            free(out);
        }
    }
    closedir(d);
    names_sort(&names);
    for (size_t i = 0; i < names.n; i++) {
        const char *name = names.v[i];
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
            int sub = open_dir_at(dfd, name);
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
            returned(w, dfd, name, &st);
        }
    }
    if (names.dropped)
        stop_listing(w, dfd, plen);
    names_free(&names);
}

void collect(int run_ok)
{
    static struct walk w;
    struct stat st;
    memset(&w, 0, sizeof w);
    int wd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (wd < 0)
        fatal("cannot open the working directory: %s", strerror(errno));
    if (cfg.collect == C_OUTPUTS && fstatat(wd, "outputs", &st, AT_SYMLINK_NOFOLLOW) == 0) {
        strcpy(w.path, "outputs");
        if (S_ISLNK(st.st_mode)) {
            if (!unchanged(&w, wd, "outputs", 0))
                send_link(&w, wd, "outputs", &st);
        } else if (S_ISDIR(st.st_mode)) {
            int fd = open_dir_at(wd, "outputs");
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
