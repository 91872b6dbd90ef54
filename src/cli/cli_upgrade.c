/* cli_upgrade.c — `deltafin upgrade`: bring the source checkout this binary was built in up to
 * date (git pull --ff-only) and rebuild it with the options it was built with.
 *
 * Invariants:
 *   - Nothing is changed unless a fast-forward is possible: a checkout with uncommitted changes to
 *     tracked files, a detached HEAD, a branch without an upstream or one diverged from it is
 *     refused before anything is pulled. --dry-run fetches and changes nothing else.
 *   - git and make run as child processes from argument vectors (posix_spawnp), never a shell.
 *   - The rebuild is `make` with exactly the options in BUILD/build-options, which the Makefile
 *     writes when it links BUILD/deltafin. A failed rebuild leaves ./deltafin as it was (the
 *     Makefile replaces it by cp + mv only after a successful link).
 *   - Models, stores and caches under the model root ($DELTAFIN_HOME, else ~/.deltafin) are only
 *     read. After a rebuild the NEW binary runs `deltafin upgrade --check-stores` (internal, not
 *     in --help; every later binary must keep accepting it, since older ones call it): for each
 *     store ROOT/install.json names it reports the manifest's format version, and a store older
 *     than DFSP_VERSION goes through the migration table below.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "cli/cli.h"
#include "store/dfsp.h"

extern char **environ;

static const char *HELP =
    "usage: deltafin upgrade [--dry-run]\n"
    "Updates the git checkout this binary was built in (git pull --ff-only) and rebuilds it with\n"
    "the options it was built with (BUILD/build-options, written by the Makefile). Refuses a\n"
    "checkout with uncommitted changes, a detached HEAD, a branch without an upstream, or one that\n"
    "has diverged from its upstream. Never changes models, stores or caches ($DELTAFIN_HOME, else\n"
    "~/.deltafin): the new binary checks the format version of each store listed in install.json.\n"
    "--dry-run fetches and says what would happen, changing nothing else.\n";

/* The store-format migrations, in order: an entry rewrites a store of version `from` as version
 * from + 1, in place and safe against interruption (new files first, manifest.json renamed over
 * last). DFSP has had one version so far, so the table holds only its terminator; a change that
 * bumps DFSP_VERSION (store/dfsp.h) adds its step here. */
static const struct {
    int64_t from;
    int (*fn)(const char *store, errbuf *err);
} upgrade_migrations[] = {
    {.from = -1, .fn = NULL}, /* terminator */
};

#define NO_MORE ((const char *)NULL) /* ends upgrade_git's arguments */

enum { UPGRADE_OUT_CAP = 65536, UPGRADE_MAX_OPTS = 16, UPGRADE_MAX_ARGS = 40 };

typedef struct upgrade_ctx {
    char exe[PATH_MAX];                   /* this binary */
    char top[PATH_MAX];                   /* the checkout */
    char target[PATH_MAX];                /* make's target, relative to top */
    char opts[UPGRADE_MAX_OPTS][PATH_MAX]; /* "VAR=value" from build-options */
    int nopts;
    char branch[256], upstream[512], old[64], new[64];
    char out[UPGRADE_OUT_CAP]; /* the last child's captured output */
} upgrade_ctx;

/* Runs argv (argv[0] looked up in PATH). out != NULL: its stdout and stderr are captured into
 * out[cap] (truncated, trailing newlines dropped); else they are ours. Returns the exit status
 * (128 + signal when killed), or -1 with err set when it could not be started. */
static int upgrade_child_run(char *const *argv, char *out, size_t cap, errbuf *err)
{
    int fds[2] = {-1, -1}, st;
    size_t n = 0;
    pid_t pid;
    posix_spawn_file_actions_t fa;
    fflush(NULL); /* what we printed comes before what the child prints */
    if (out && pipe2(fds, O_CLOEXEC) != 0)
        return errbuf_errno(err, "pipe");
    posix_spawn_file_actions_init(&fa);
    if (out) {
        posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
        posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    }
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (out)
        close(fds[1]);
    if (rc != 0) {
        if (out)
            close(fds[0]);
        return errbuf_set(err, "cannot run %s: %s", argv[0], strerror(rc));
    }
    if (out) {
        char buf[4096];
        for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) != 0 && (r > 0 || errno == EINTR);) {
            size_t take = r < 0 ? 0 : (size_t)r < cap - 1 - n ? (size_t)r : cap - 1 - n; /* past cap: dropped */
            memcpy(out + n, buf, take);
            n += take;
        }
        close(fds[0]);
        while (n > 0 && out[n - 1] == '\n')
            n--;
        out[n] = '\0';
    }
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return errbuf_errno(err, "waitpid");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* git -C dir ARGS... (NULL-terminated), its output captured in c->out. Returns git's exit status,
 * or -1 when git could not be run. must: any status but 0 is an error naming the command and
 * git's last line. */
static int upgrade_git(upgrade_ctx *c, const char *dir, int must, errbuf *err, ...)
{
    char *argv[UPGRADE_MAX_ARGS] = {"git", "-C", (char *)dir};
    int n = 3;
    va_list ap;
    va_start(ap, err);
    for (const char *a; n < UPGRADE_MAX_ARGS - 1 && (a = va_arg(ap, const char *));)
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    int rc = upgrade_child_run(argv, c->out, sizeof c->out, err);
    if (rc > 0 && must) {
        const char *last = strrchr(c->out, '\n') ? strrchr(c->out, '\n') + 1 : c->out;
        return errbuf_set(err, "git %s failed in %s (status %d): %s", argv[3], dir, rc, last);
    }
    return rc;
}

/* 1 if the files a and b hold the same bytes. */
static int upgrade_files_same(const char *a, const char *b)
{
    file_map ma = {0}, mb = {0};
    errbuf e;
    int same = file_map_open(&ma, a, &e) == 0 && file_map_open(&mb, b, &e) == 0 && ma.size == mb.size &&
               (ma.size == 0 || memcmp(ma.data, mb.data, ma.size) == 0);
    file_map_close(&ma);
    file_map_close(&mb);
    return same;
}

/* Reads BUILD/build-options (build relative to c->top) into c->opts; c->target names `deltafin`
 * (root) or BUILD/deltafin. */
static int upgrade_options_read(upgrade_ctx *c, const char *build, int root, errbuf *err)
{
    char path[PATH_MAX + 32], *text = NULL, *save = NULL;
    size_t len;
    const char *recorded = build;
    snprintf(path, sizeof path, "%s/%s/build-options", c->top, build);
    if (file_read_all(path, &text, &len, err) != 0)
        return errbuf_prefix(err, "no build options recorded (rebuild once with make)");
    c->nopts = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        size_t k = strspn(line, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_");
        if (k == 0 || line[k] != '=' || c->nopts == UPGRADE_MAX_OPTS || strlen(line) >= sizeof c->opts[0]) {
            free(text);
            return errbuf_set(err, "%s: '%.60s' is not a VAR=value line", path, line);
        }
        snprintf(c->opts[c->nopts++], sizeof c->opts[0], "%s", line);
        if (!strncmp(line, "BUILD=", 6))
            recorded = c->opts[c->nopts - 1] + 6;
    }
    free(text);
    snprintf(c->target, sizeof c->target, "%s%s", root ? "" : recorded, root ? "deltafin" : "/deltafin");
    return 0;
}

/* Finds the checkout from /proc/self/exe: the binary is CHECKOUT/deltafin (then the build folder
 * is the CHECKOUT/build* whose deltafin has the same bytes) or CHECKOUT/build*\/deltafin. */
static int upgrade_checkout_find(upgrade_ctx *c, errbuf *err)
{
    char dir[PATH_MAX], real[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", c->exe, sizeof c->exe - 1);
    if (n <= 0)
        return errbuf_errno(err, "/proc/self/exe");
    c->exe[n] = '\0';
    snprintf(dir, sizeof dir, "%s", c->exe);
    *strrchr(dir, '/') = '\0';
    if (!dir[0])
        snprintf(dir, sizeof dir, "/");
    int rc = upgrade_git(c, dir, 0, err, "rev-parse", "--show-toplevel", NO_MORE);
    if (rc != 0)
        return rc < 0 ? -1 : errbuf_set(err, "%s is not in a git checkout; upgrade updates a source checkout", c->exe);
    if (!realpath(c->out, real))
        return errbuf_errno(err, c->out);
    snprintf(c->top, sizeof c->top, "%s", real);
    const char *base = strrchr(dir, '/') + 1;
    size_t tl = strlen(c->top);
    if (!strncmp(dir, c->top, tl) && dir[tl] == '/' && base == dir + tl + 1 && !strncmp(base, "build", 5))
        return upgrade_options_read(c, base, 0, err);
    if (strcmp(dir, c->top) != 0)
        return errbuf_set(err, "%s is neither CHECKOUT/deltafin nor CHECKOUT/build*/deltafin of the checkout %s",
                          c->exe, c->top);
    DIR *d = opendir(c->top);
    char bin[PATH_MAX + 300], build[256] = "";
    if (!d)
        return errbuf_errno(err, c->top);
    for (struct dirent *e; !build[0] && (e = readdir(d));) {
        snprintf(bin, sizeof bin, "%s/%s/deltafin", c->top, e->d_name);
        if (!strncmp(e->d_name, "build", 5) && upgrade_files_same(c->exe, bin))
            snprintf(build, sizeof build, "%s", e->d_name);
    }
    closedir(d);
    if (!build[0])
        return errbuf_set(err, "no %s/build*/deltafin is this binary, so its build options are unknown; rebuild once "
                               "with make",
                          c->top);
    return upgrade_options_read(c, build, 1, err);
}

/* Refuses a checkout with uncommitted changes to tracked files, naming the first few. */
static int upgrade_tree_check(upgrade_ctx *c, errbuf *err)
{
    if (upgrade_git(c, c->top, 1, err, "status", "--porcelain", "-z", "--untracked-files=no", NO_MORE))
        return -1;
    char names[400] = "";
    size_t used = 0;
    int count = 0;
    for (const char *p = c->out; *p;) { /* "XY path\0", a rename or copy followed by "from\0" */
        int moved = p[0] == 'R' || p[0] == 'C';
        if (strlen(p) > 3 && count++ < 4)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", count > 1 ? ", " : "",
                                     count == 4 ? "..." : p + 3);
        used = used < sizeof names ? used : sizeof names - 1;
        p += strlen(p) + 1;
        if (moved && *p)
            p += strlen(p) + 1;
    }
    if (count > 0)
        return errbuf_set(err, "the checkout %s has uncommitted changes (%s); commit or stash them first", c->top,
                          names);
    return 0;
}

/* Prints one line (printf) and returns rc, so a check can `return upgrade_note(1, ...)`. */
__attribute__((format(printf, 2, 3))) static int upgrade_note(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    return rc;
}

/* Checks one registered store: its manifest's format version against DFSP_VERSION, migrating an
 * older one. Reads manifest.json only. Returns 1 for a problem (printed), else 0. */
static int upgrade_store_check(const char *name, const char *store, const char *root)
{
    char dir[PATH_MAX], man[PATH_MAX + 16], who[PATH_MAX + 300];
    errbuf err = {{0}};
    snprintf(dir, sizeof dir, "%s%s%s", store[0] == '/' ? "" : root, store[0] == '/' ? "" : "/", store);
    snprintf(man, sizeof man, "%s/manifest.json", dir);
    snprintf(who, sizeof who, "upgrade: store %s (%s)", name, dir);
    if (!file_exists(man))
        return upgrade_note(0, "%s: %s; skipped\n", who, file_is_dir(dir) ? "no manifest.json" : "not there");
    json_t *j = jsonr_load_file(man, &err);
    const char *fmt = json_string_value(json_object_get(j, "format"));
    const json_t *jv = json_object_get(j, "version");
    long long v = json_is_integer(jv) ? (long long)json_integer_value(jv) : -1, dfsp = fmt && !strcmp(fmt, "dfsp");
    json_decref(j);
    if (!j || !dfsp || v < 0)
        return upgrade_note(1, "%s: %s\n", who, j ? "not a DFSP manifest (format, version)" : err.msg);
    if (v > DFSP_VERSION)
        return upgrade_note(1, "%s: format version %lld, newer than this build's %d: cannot open it\n", who, v,
                            DFSP_VERSION);
    if (v == DFSP_VERSION)
        return upgrade_note(0, "%s: format version %lld, current\n", who, v);
    for (; v < DFSP_VERSION; v++) {
        int i = 0;
        while (upgrade_migrations[i].fn && upgrade_migrations[i].from != v)
            i++;
        if (!upgrade_migrations[i].fn)
            return upgrade_note(1, "%s: format version %lld, no migration to %d; rerun deltafin prepare\n", who, v,
                                DFSP_VERSION);
        printf("%s: migrating format version %lld -> %lld\n", who, v, v + 1);
        if (upgrade_migrations[i].fn(dir, &err) != 0)
            return upgrade_note(1, "%s: migration failed: %s\n", who, err.msg);
    }
    return upgrade_note(0, "%s: format version %d now, current\n", who, DFSP_VERSION);
}

/* Every object with a "store" string anywhere in install.json is a store; its key names it. */
static int upgrade_json_walk(const json_t *v, const char *name, const char *root, int depth, int *found)
{
    int bad = 0;
    const char *k, *store = json_string_value(json_object_get(v, "store"));
    const json_t *x;
    size_t i;
    if (store) {
        (*found)++;
        bad += upgrade_store_check(name, store, root);
    }
    if (depth < 16 && json_is_object(v))
        json_object_foreach((json_t *)v, k, x) bad += upgrade_json_walk(x, k, root, depth + 1, found);
    if (depth < 16 && json_is_array(v))
        json_array_foreach(v, i, x) bad += upgrade_json_walk(x, name, root, depth + 1, found);
    return bad;
}

/* `upgrade --check-stores`: the store check, by the binary whose format is current. */
static int upgrade_stores_check(errbuf *err)
{
    char root[PATH_MAX], path[PATH_MAX + 16];
    if (cli_model_root(NULL, root, sizeof root, err))
        return -1;
    snprintf(path, sizeof path, "%s/install.json", root);
    if (!file_exists(path))
        return upgrade_note(0, "upgrade: no stores registered under %s (no install.json); nothing to check\n", root);
    json_t *j = jsonr_load_file(path, err);
    if (!j)
        return -1;
    int found = 0, bad = upgrade_json_walk(j, "?", root, 0, &found);
    json_decref(j);
    if (!found)
        printf("upgrade: %s registers no stores; nothing to check\n", path);
    return bad ? errbuf_set(err, "%d store(s) under %s need attention (above)", bad, root) : 0;
}

static int upgrade_run(upgrade_ctx *c, int dry, errbuf *err)
{
    long behind = 0, ahead = 0;
    int rc;
    if (upgrade_checkout_find(c, err) || upgrade_git(c, c->top, 1, err, "rev-parse", "--short", "HEAD", NO_MORE))
        return -1;
    snprintf(c->old, sizeof c->old, "%s", c->out);
    if ((rc = upgrade_git(c, c->top, 0, err, "symbolic-ref", "-q", "--short", "HEAD", NO_MORE)) != 0)
        return rc < 0 ? -1
                      : errbuf_set(err, "the checkout %s has a detached HEAD (at %s); check out a branch first", c->top,
                                   c->old);
    snprintf(c->branch, sizeof c->branch, "%s", c->out);
    if ((rc = upgrade_git(c, c->top, 0, err, "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}",
                          NO_MORE)) != 0)
        return rc < 0 ? -1
                      : errbuf_set(err, "branch %s of %s has no upstream configured (git branch --set-upstream-to)",
                                   c->branch, c->top);
    snprintf(c->upstream, sizeof c->upstream, "%s", c->out);
    if (upgrade_tree_check(c, err) || upgrade_git(c, c->top, 1, err, "fetch", "--quiet", NO_MORE) ||
        upgrade_git(c, c->top, 1, err, "rev-list", "--left-right", "--count", "HEAD...@{upstream}", NO_MORE))
        return -1;
    if (sscanf(c->out, "%ld %ld", &ahead, &behind) != 2)
        return errbuf_set(err, "git rev-list --count said '%.40s'", c->out);
    if (ahead > 0 && behind > 0)
        return errbuf_set(err, "the checkout %s: %s has diverged from %s (%ld local commit%s, %ld upstream); refusing "
                               "to merge",
                          c->top, c->branch, c->upstream, ahead, ahead == 1 ? "" : "s", behind);
    printf("upgrade: %s: %s at %s, upstream %s\n", c->top, c->branch, c->old, c->upstream);
    if (behind == 0) {
        printf("upgrade: already up to date%s; no rebuild needed\n", ahead ? " (local commits not pushed)" : "");
        return dry ? 0 : upgrade_stores_check(err);
    }
    char jobs[32], *argv[UPGRADE_MAX_ARGS] = {"make", "--no-print-directory", "-C", c->top, jobs}, line[4096];
    int n = 5;
    snprintf(jobs, sizeof jobs, "-j%ld", sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1);
    for (int i = 0; i < c->nopts; i++)
        argv[n++] = c->opts[i];
    argv[n++] = c->target;
    argv[n] = NULL;
    size_t used = 0;
    for (int i = 0; argv[i] && used < sizeof line; i++)
        used += (size_t)snprintf(line + used, sizeof line - used, "%s%s", i ? " " : "", argv[i]);
    if (dry) {
        if (upgrade_git(c, c->top, 1, err, "rev-parse", "--short", "@{upstream}", NO_MORE))
            return -1;
        printf("upgrade: would pull %ld commit%s (%s -> %s) and rebuild: %s\n", behind, behind == 1 ? "" : "s",
               c->old, c->out, line);
        printf("upgrade: then the new binary would check the stores under the model root; nothing changed\n");
        return 0;
    }
    if (upgrade_git(c, c->top, 1, err, "pull", "--ff-only", "--no-rebase", "--quiet", NO_MORE) ||
        upgrade_git(c, c->top, 1, err, "rev-parse", "--short", "HEAD", NO_MORE))
        return -1;
    snprintf(c->new, sizeof c->new, "%s", c->out);
    printf("upgrade: pulled %s -> %s (%ld commit%s from %s)\n", c->old, c->new, behind, behind == 1 ? "" : "s",
           c->upstream);
    printf("upgrade: rebuilding: %s\n", line);
    if ((rc = upgrade_child_run(argv, NULL, 0, err)) != 0)
        return rc < 0 ? -1
                      : errbuf_set(err, "the rebuild failed (make exited with status %d); the checkout is at %s and "
                                        "%s/%s %s",
                                   rc, c->new, c->top, c->target,
                                   strcmp(c->target, "deltafin") ? "is as make left it" : "is still the old binary");
    char bin[PATH_MAX * 2 + 2], *check[] = {bin, "upgrade", "--check-stores", NULL};
    snprintf(bin, sizeof bin, "%s/%s", c->top, c->target);
    printf("upgrade: rebuilt %s; checking stores with it\n", bin);
    if ((rc = upgrade_child_run(check, NULL, 0, err)) != 0)
        return rc < 0 ? -1 : errbuf_set(err, "upgraded to %s, but the new binary's store check failed (status %d)",
                                        c->new, rc);
    return 0;
}

int cmd_upgrade(int argc, char **argv)
{
    const char *cmd = "upgrade";
    int dry = 0, check_stores = 0, rc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--dry-run")) {
            dry = 1;
        } else if (!strcmp(argv[i], "--check-stores")) {
            check_stores = 1;
        } else {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        }
    }
    errbuf err = {{0}};
    upgrade_ctx *c = check_stores ? NULL : calloc(1, sizeof *c);
    if (check_stores)
        rc = upgrade_stores_check(&err);
    else
        rc = c ? upgrade_run(c, dry, &err) : errbuf_set(&err, "out of memory");
    free(c);
    fflush(stdout); /* the error line comes last */
    return rc != 0 ? cli_fail(cmd, &err) : 0;
}
