/* cli_setup.c — `deltafin setup` and `deltafin setup-qwen`: models from the Hugging Face hub onto
 * the drives (hub/hub.h), a DFSP store prepared from them (store/dfsp.h), and the install record
 * that run and serve read when no --model is given (cli_model_pick).
 *
 * The model root (--model-root, $DELTAFIN_HOME, ~/.deltafin) holds:
 *     install.json                      what is installed (written last, temp + rename)
 *     hub/OWNER--NAME.json              each repo's resolution: commit, files, sizes, hashes
 *     download/OWNER--NAME@COMMIT/      K3's files as fetched (removed once the store is complete)
 *     k3/                               the DFSP store (its packs there or on --drives)
 *     k3-dspark/                        the DSpark drafter, found beside the store by `run`
 *     qwen3-0.6b-base/, qwen3-1.7b-base/, k3-qwen3-drafter -> qwen3-0.6b-base
 *
 * Invariants: a rerun continues where a killed or failed run stopped, fetching nothing already
 * verified (hub.h); a repo's resolution is recorded before its first byte is fetched and reused by
 * reruns, so one install never mixes two commits; install.json names only complete parts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "cli/cli.h"
#include "engine/stream.h"
#include "hub/hub.h"
#include "model/model.h"
#include "store/dfsp.h"
#include "store/store.h"

/* The releases setup installs. K3's own commit is resolved from `main` on the first run and
 * pinned in the model root from then on (--revision pins another); the DSpark commit is the one
 * docs/INSTALL.md names. */
#define K3_REPO "moonshotai/Kimi-K3"
#define DSPARK_REPO "Inferact/Kimi-K3-DSpark"
#define DSPARK_REV "cf6b8244620e7ea4b0651d214f28e89eac75bed6"

static const struct qwen_release {
    const char *repo, *dir;
} QWEN[] = {
    {.repo = "Qwen/Qwen3-0.6B-Base", .dir = "qwen3-0.6b-base"},
    {.repo = "Qwen/Qwen3-1.7B-Base", .dir = "qwen3-1.7b-base"},
};

static const char *HELP =
    "usage: deltafin setup --full [--model-root DIR] [--drives DIR,...] [--mirrors N] [--include-qwen]\n"
    "                      [--revision REV] [--parallel N] [--keep-download] [--dry-run]\n"
    "       deltafin setup --stream [--model-root DIR] [--revision REV] [--prefetch-hot N] [--dry-run]\n"
    "       deltafin setup --check [--model-root DIR]\n"
    "       deltafin setup-qwen [--model-root DIR] [--parallel N] [--dry-run]\n"
    "--full downloads Kimi K3 (" K3_REPO ") and its DSpark drafter (" DSPARK_REPO ") from the\n"
    "Hugging Face hub, verifies every file's sha256, and prepares a DFSP store over the drives; run\n"
    "and serve without --model then use it. Resumable: rerun after any interruption. --dry-run prints\n"
    "the plan (what, how big, where, the free space) and changes nothing.\n"
    "--stream installs config, tokenizer, spine and DSpark only (about 115 GB for K3); each routed\n"
    "expert is fetched by HTTP Range the first time it is used and kept on the drive (--prefetch-hot\n"
    "N fetches the N most routed so far now). --check verifies an install offline. setup-qwen installs\n"
    "the Qwen3 0.6B and 1.7B Base drafters. The model root defaults to $DELTAFIN_HOME, else\n"
    "~/.deltafin. The hub is $HF_ENDPOINT (https://huggingface.co), with $HF_TOKEN for gated repos;\n"
    "HF_HUB_OFFLINE=1 uses only what is already downloaded.\n"
    "See docs/INSTALL.md.\n";

typedef struct setup_ctx {
    const char *cmd;
    char root[4096];
    hub_opts ho;
    hub *h;
    int dry_run, keep_download;
    const char *revision;            /* K3's, when given */
    const char *drives[STORE_MAX_PACKS];
    int ndrives, mirrors;
    char drives_buf[8192];
} setup_ctx;

/* ---- the pieces of the model root ---- */

static void repo_slug(const char *repo, char *out, size_t cap)
{
    snprintf(out, cap, "%s", repo);
    char *s = strchr(out, '/');
    if (s && strlen(out) + 2 < cap) { /* "owner/name" -> "owner--name" */
        memmove(s + 2, s + 1, strlen(s + 1) + 1);
        s[0] = s[1] = '-';
    }
}

/* A folder holds one repo at one commit: DIR/.hub-commit says which ("OWNER/NAME@COMMIT"), written
 * before the first byte goes in. A folder of another commit is refused, never mixed (a file of the
 * right size would count as verified). */
#define CLAIM_FILE ".hub-commit"
static int folder_claim(const char *dir, const hub_repo *r, errbuf *err)
{
    char path[4200], want[400], *have = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, CLAIM_FILE);
    snprintf(want, sizeof want, "%s@%s\n", r->name, r->commit);
    if (file_mkdirs(dir, err))
        return -1;
    if (file_exists(path)) {
        if (file_read_all(path, &have, &len, err))
            return -1;
        int same = !strcmp(have, want);
        if (!same)
            errbuf_set(err, "%s holds %.*s, not %s@%s: remove it (or use another --model-root) to install this one", dir,
                       (int)strcspn(have, "\n"), have, r->name, r->commit);
        free(have);
        return same ? 0 : -1;
    }
    return file_write_atomic(path, want, strlen(want), err);
}

/* Files setup leaves on the hub: the model card and pictures are not part of a model. */
static int file_wanted(const char *path)
{
    static const char *const skip[] = {"*.md", "*.png", "*.jpg", "*.jpeg", "*.gif", "*.pdf", ".gitattributes", "figures/*"};
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
        if (!fnmatch(skip[i], path, 0))
            return 0;
    return 1;
}

/* The repo's resolution: the one recorded in the model root (a rerun), else the hub's. */
static int repo_get(setup_ctx *c, const char *repo, const char *rev, int force, hub_repo *r, errbuf *err)
{
    char slug[300], path[4500];
    repo_slug(repo, slug, sizeof slug);
    snprintf(path, sizeof path, "%s/hub/%s.json", c->root, slug);
    if (!force && file_exists(path)) {
        if (hub_repo_load(path, r, err))
            return -1;
        if (!rev || strlen(rev) != 40 || !strcmp(rev, r->commit))
            return 0;
        hub_repo_free(r); /* a pinned commit other than the recorded one */
    }
    if (hub_repo_resolve(c->h, repo, rev ? rev : "main", r, err))
        return -1;
    if (c->dry_run)
        return 0;
    snprintf(slug, sizeof slug, "%s/hub", c->root);
    if (file_mkdirs(slug, err) || hub_repo_save(r, path, err)) {
        hub_repo_free(r);
        return -1;
    }
    return 0;
}

/* The indices of r's wanted files into which (r->n_files long); their count. */
static int wanted(const hub_repo *r, int *which, uint64_t *bytes)
{
    int n = 0;
    *bytes = 0;
    for (int i = 0; i < r->n_files; i++)
        if (file_wanted(r->files[i].path)) {
            which[n++] = i;
            *bytes += r->files[i].size;
        }
    return n;
}

/* Bytes of which[] still to fetch into dir (complete files and parts already there count). */
static uint64_t bytes_missing(const hub_repo *r, const int *which, int n, const char *dir)
{
    uint64_t need = 0;
    for (int i = 0; i < n; i++) {
        const hub_file *f = &r->files[which[i]];
        char p[8192];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, f->path);
        if (stat(p, &sb) == 0 && (uint64_t)sb.st_size == f->size)
            continue;
        snprintf(p, sizeof p, "%s/%s.incomplete", dir, f->path);
        uint64_t have = stat(p, &sb) == 0 && (uint64_t)sb.st_size <= f->size ? (uint64_t)sb.st_size : 0;
        need += f->size - have;
    }
    return need;
}

/* ---- the disk-space preflight: bytes needed per filesystem ---- */

typedef struct space {
    dev_t dev[STORE_MAX_PACKS + 8];
    char where[STORE_MAX_PACKS + 8][4096];
    uint64_t need[STORE_MAX_PACKS + 8], avail[STORE_MAX_PACKS + 8];
    int n;
} space;

/* Adds need bytes to the filesystem that dir (or its nearest existing parent) is on. */
static int space_add(space *s, const char *dir, uint64_t need, errbuf *err)
{
    char d[4096];
    snprintf(d, sizeof d, "%s", dir);
    struct stat sb;
    struct statvfs vf;
    while (stat(d, &sb) != 0) {
        char *sl = strrchr(d, '/');
        if (!sl || sl == d) {
            snprintf(d, sizeof d, "%s", sl == d ? "/" : ".");
            break;
        }
        *sl = 0;
    }
    if (stat(d, &sb) != 0 || statvfs(d, &vf) != 0)
        return errbuf_errno(err, d);
    for (int i = 0; i < s->n; i++)
        if (s->dev[i] == sb.st_dev) {
            s->need[i] += need;
            return 0;
        }
    if (s->n == (int)(sizeof s->dev / sizeof s->dev[0]))
        return errbuf_set(err, "too many filesystems");
    s->dev[s->n] = sb.st_dev;
    snprintf(s->where[s->n], sizeof s->where[0], "%s", dir);
    s->need[s->n] = need;
    s->avail[s->n] = (uint64_t)vf.f_bavail * vf.f_frsize;
    s->n++;
    return 0;
}

static void gb(uint64_t b, char *out, size_t cap)
{
    if (b >= 1000000000000ull)
        snprintf(out, cap, "%.2f TB", (double)b / 1e12);
    else if (b >= 1000000000ull)
        snprintf(out, cap, "%.2f GB", (double)b / 1e9);
    else
        snprintf(out, cap, "%.1f MB", (double)b / 1e6);
}

/* Prints each filesystem's need against its free space; -1 (err) when one is short. */
static int space_check(const space *s, int print, errbuf *err)
{
    int rc = 0;
    for (int i = 0; i < s->n; i++) {
        /* a margin for folders, manifests and the store's 4 KiB alignment */
        uint64_t need = s->need[i] + s->need[i] / 100 + (1u << 20);
        char a[32], b[32];
        gb(need, a, sizeof a);
        gb(s->avail[i], b, sizeof b);
        if (print)
            printf("  space: %s needs %s at the peak, %s free%s\n", s->where[i], s->need[i] ? a : "nothing more", b,
                   s->need[i] && need > s->avail[i] ? "  NOT ENOUGH" : "");
        if (s->need[i] && need > s->avail[i] && rc == 0)
            rc = errbuf_set(err, "not enough space on the filesystem of %s: setup needs %s there, %s is free", s->where[i],
                            a, b);
    }
    return rc;
}

/* ---- install.json ---- */

static int install_load(const setup_ctx *c, json_t **out, errbuf *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/install.json", c->root);
    *out = file_exists(path) ? jsonr_load_file(path, err) : json_pack("{s:s, s:i}", "format", "deltafin-install", "version", 1);
    if (*out && !json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return errbuf_set(err, "%s: not a JSON object", path);
    }
    return *out ? 0 : -1;
}

static int install_save(const setup_ctx *c, json_t *inst, errbuf *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/install.json", c->root);
    char *txt = json_dumps(inst, JSON_INDENT(1) | JSON_SORT_KEYS);
    if (!txt)
        return errbuf_set(err, "%s: out of memory", path);
    int rc = file_write_atomic(path, txt, strlen(txt), err);
    free(txt);
    return rc;
}

static json_t *install_entry(const hub_repo *r, const char *key, const char *path)
{
    return json_pack("{s:s, s:s, s:s}", "repo", r->name, "commit", r->commit, key, path);
}

/* ---- fetching ---- */

static int fetch(setup_ctx *c, const hub_repo *r, const int *which, int n, const char *dir, errbuf *err)
{
    hub_stats st;
    if (hub_repo_file(r, CLAIM_FILE))
        return errbuf_set(err, "%s@%.12s has a file named %s, which setup keeps for itself", r->name, r->commit,
                          CLAIM_FILE);
    if (folder_claim(dir, r, err) || hub_download(c->h, r, which, n, dir, &st, err))
        return -1;
    char a[32], b[32];
    gb(st.bytes_fetched, a, sizeof a);
    gb(st.bytes_reused, b, sizeof b);
    printf("setup: %s@%.12s: %d files fetched, %d already here (%s fetched in %.1f s, %s reused); %d retries, %d "
           "corrupt files fetched again\n",
           r->name, r->commit, st.files_fetched, st.files_present, a, st.seconds, b, st.retries, st.corrupt);
    return 0;
}

/* Removes what hub_download put in dir (r's files, their parts) and the folders left empty. */
static void remove_download(const hub_repo *r, const char *dir)
{
    char p[8192];
    for (int i = 0; i < r->n_files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, r->files[i].path);
        unlink(p);
        snprintf(p, sizeof p, "%s/%s.incomplete", dir, r->files[i].path);
        unlink(p);
        for (char *s; (s = strrchr(p, '/')) && (size_t)(s - p) > strlen(dir);) {
            *s = 0;
            rmdir(p);
        }
    }
    snprintf(p, sizeof p, "%s/%s", dir, CLAIM_FILE);
    unlink(p);
    rmdir(dir);
    char parent[4200];
    snprintf(parent, sizeof parent, "%s", dir);
    char *sl = strrchr(parent, '/');
    if (sl) {
        *sl = 0;
        rmdir(parent); /* download/, when nothing else is in it */
    }
}

/* Points ROOT/k3-qwen3-drafter (where `run` looks beside the store) at the 0.6B drafter. */
static int link_qwen_drafter(const setup_ctx *c, errbuf *err)
{
    char link[4300], tmp[4400];
    snprintf(link, sizeof link, "%s/k3-qwen3-drafter", c->root);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", link, (int)getpid());
    unlink(tmp);
    if (symlink(QWEN[0].dir, tmp) || rename(tmp, link)) {
        unlink(tmp);
        return errbuf_errno(err, link);
    }
    return 0;
}

static int setup_full(setup_ctx *c, int include_qwen, errbuf *err)
{
    hub_repo k3 = {0}, ds = {0}, qw[2];
    memset(qw, 0, sizeof qw);
    int *wk = NULL, *wd = NULL, *wq[2] = {NULL, NULL}, nk, nd, nq[2] = {0, 0};
    uint64_t bk, bd, bq[2] = {0, 0};
    char slug[300], dl[4500], store[4200], dsdir[4200], qdir[2][4200];
    json_t *inst = NULL;
    int rc = -1;
    space sp = {.n = 0};
    if (repo_get(c, K3_REPO, c->revision, c->revision != NULL, &k3, err) ||
        repo_get(c, DSPARK_REPO, DSPARK_REV, 0, &ds, err))
        goto done;
    for (int q = 0; include_qwen && q < 2; q++)
        if (repo_get(c, QWEN[q].repo, NULL, 0, &qw[q], err))
            goto done;
    wk = malloc(sizeof(int) * (size_t)(k3.n_files + 1));
    wd = malloc(sizeof(int) * (size_t)(ds.n_files + 1));
    for (int q = 0; q < 2; q++)
        wq[q] = malloc(sizeof(int) * (size_t)(qw[q].n_files + 1));
    if (!wk || !wd || !wq[0] || !wq[1]) {
        errbuf_set(err, "setup: out of memory");
        goto done;
    }
    nk = wanted(&k3, wk, &bk);
    nd = wanted(&ds, wd, &bd);
    for (int q = 0; include_qwen && q < 2; q++)
        nq[q] = wanted(&qw[q], wq[q], &bq[q]);
    repo_slug(K3_REPO, slug, sizeof slug);
    snprintf(dl, sizeof dl, "%s/download/%s@%.12s", c->root, slug, k3.commit);
    snprintf(store, sizeof store, "%s/k3", c->root);
    snprintf(dsdir, sizeof dsdir, "%s/k3-dspark", c->root);
    for (int q = 0; q < 2; q++)
        snprintf(qdir[q], sizeof qdir[q], "%s/%s", c->root, QWEN[q].dir);

    /* the plan and the space it needs at its peak: the download and the store side by side */
    int store_done = dfsp_is_store(store);
    uint64_t st_bytes = 0;
    for (int i = 0; i < nk; i++)
        if (!fnmatch("*.safetensors", k3.files[wk[i]].path, 0))
            st_bytes += k3.files[wk[i]].size;
    st_bytes *= (uint64_t)c->mirrors;
    uint64_t k3_missing = store_done ? 0 : bytes_missing(&k3, wk, nk, dl);
    if (space_add(&sp, dl, k3_missing, err) || space_add(&sp, dsdir, bytes_missing(&ds, wd, nd, dsdir), err))
        goto done;
    for (int q = 0; include_qwen && q < 2; q++)
        if (space_add(&sp, qdir[q], bytes_missing(&qw[q], wq[q], nq[q], qdir[q]), err))
            goto done;
    for (int d = 0; d < (c->ndrives ? c->ndrives : 1); d++)
        if (space_add(&sp, c->ndrives ? c->drives[d] : store, store_done ? 0 : st_bytes / (uint64_t)(c->ndrives ? c->ndrives : 1), err))
            goto done;
    if (c->dry_run) {
        char a[32], b[32];
        printf("setup --full: plan for %s\n", c->root);
        gb(bk, a, sizeof a);
        gb(k3_missing, b, sizeof b);
        printf("  %s@%s: %d files, %s, %s still to fetch, into %s\n", K3_REPO, k3.commit, nk, a, b, dl);
        gb(bd, a, sizeof a);
        printf("  %s@%s: %d files, %s, into %s\n", DSPARK_REPO, ds.commit, nd, a, dsdir);
        for (int q = 0; include_qwen && q < 2; q++) {
            gb(bq[q], a, sizeof a);
            printf("  %s@%s: %d files, %s, into %s\n", QWEN[q].repo, qw[q].commit, nq[q], a, qdir[q]);
        }
        gb(st_bytes, a, sizeof a);
        printf("  DFSP store: %s%s over %d drive(s) (%s), %d mirror(s), in %s; the download is removed after it\n", a,
               store_done ? " (already complete)" : "", c->ndrives ? c->ndrives : 1, c->ndrives ? c->drives_buf : store,
               c->mirrors, store);
        space_check(&sp, 1, err); /* a dry run reports a shortage, it does not fail on it */
        rc = 0;
        goto done;
    }
    if (space_check(&sp, 0, err) || folder_claim(store, &k3, err))
        goto done;

    /* the small drafter first: a failure on K3 leaves it usable for the next run */
    if (fetch(c, &ds, wd, nd, dsdir, err))
        goto done;
    if (!store_done) {
        if (fetch(c, &k3, wk, nk, dl, err))
            goto done;
        dfsp_prepare_opts po = {.drives = c->ndrives ? c->drives : NULL, .ndrives = c->ndrives, .mirrors = c->mirrors};
        dfsp_prepare_stats ps;
        int pr = dfsp_prepare(dl, store, &po, &ps, err);
        if (pr == DFSP_STOPPED) {
            rc = DFSP_STOPPED;
            goto done;
        }
        if (pr) {
            errbuf_prefix(err, "preparing the store");
            goto done;
        }
        printf("setup: store %s: %d blobs, %.2f GB written in %.1f s\n", store, ps.blobs, (double)ps.bytes / 1e9,
               ps.seconds);
    } else {
        printf("setup: store %s is already complete\n", store);
    }
    if (!c->keep_download)
        remove_download(&k3, dl);
    for (int q = 0; include_qwen && q < 2; q++)
        if (fetch(c, &qw[q], wq[q], nq[q], qdir[q], err))
            goto done;
    if ((include_qwen && link_qwen_drafter(c, err)) || install_load(c, &inst, err))
        goto done;
    json_t *k3e = install_entry(&k3, "store", store);
    if (c->ndrives) {
        json_t *dr = json_array();
        for (int d = 0; d < c->ndrives; d++)
            json_array_append_new(dr, json_string(c->drives[d]));
        json_object_set_new(k3e, "drives", dr);
    }
    json_object_set_new(k3e, "mirrors", json_integer(c->mirrors));
    json_object_set_new(inst, "k3", k3e);
    json_object_set_new(inst, "dspark", install_entry(&ds, "dir", dsdir));
    if (include_qwen) {
        json_t *qa = json_array();
        for (int q = 0; q < 2; q++)
            json_array_append_new(qa, install_entry(&qw[q], "dir", qdir[q]));
        json_object_set_new(inst, "qwen", qa);
    }
    if (install_save(c, inst, err))
        goto done;
    printf("setup: installed %s@%.12s in %s; `deltafin run` and `deltafin serve` without --model use it\n", K3_REPO,
           k3.commit, c->root);
    rc = 0;
done:
    json_decref(inst);
    hub_repo_free(&k3);
    hub_repo_free(&ds);
    for (int q = 0; q < 2; q++) {
        hub_repo_free(&qw[q]);
        free(wq[q]);
    }
    free(wk);
    free(wd);
    return rc;
}

static int setup_qwen(setup_ctx *c, errbuf *err)
{
    json_t *inst = NULL, *qa = json_array();
    int rc = -1;
    hub_repo r = {0};
    for (int q = 0; q < 2; q++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", c->root, QWEN[q].dir);
        if (repo_get(c, QWEN[q].repo, NULL, 0, &r, err))
            goto done;
        int *w = malloc(sizeof(int) * (size_t)(r.n_files + 1));
        uint64_t bytes;
        if (!w) {
            errbuf_set(err, "setup-qwen: out of memory");
            goto done;
        }
        int n = wanted(&r, w, &bytes);
        space sp = {.n = 0};
        int fail = space_add(&sp, dir, bytes_missing(&r, w, n, dir), err) || space_check(&sp, c->dry_run, err);
        if (c->dry_run) {
            char a[32];
            gb(bytes, a, sizeof a);
            printf("setup-qwen: %s@%s: %d files, %s, into %s\n", r.name, r.commit, n, a, dir);
        } else if (!fail) {
            fail = fetch(c, &r, w, n, dir, err);
        }
        free(w);
        if (fail && !c->dry_run)
            goto done;
        json_array_append_new(qa, install_entry(&r, "dir", dir));
        hub_repo_free(&r);
    }
    if (c->dry_run) {
        rc = 0;
        goto done;
    }
    if (link_qwen_drafter(c, err) || install_load(c, &inst, err))
        goto done;
    json_object_set(inst, "qwen", qa);
    if (install_save(c, inst, err))
        goto done;
    printf("setup-qwen: installed; %s/k3-qwen3-drafter is the 0.6B drafter `run --draft qwen` finds beside K3\n",
           c->root);
    rc = 0;
done:
    hub_repo_free(&r);
    json_decref(qa);
    json_decref(inst);
    return rc;
}

/* ---- --stream: config, tokenizer, spine and DSpark now, each expert when it is first routed ---- */

/* dir/NAME as a sparse file of the shard's size holding its safetensors header (fetched by two
 * Range requests), written as a temp file and renamed: a shard present is a shard whose header is. */
static int stream_shard_header(setup_ctx *c, const hub_repo *r, const hub_file *f, const char *dir, errbuf *err)
{
    char path[8192], tmp[8300];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, f->path);
    if (stat(path, &sb) == 0 && (uint64_t)sb.st_size == f->size)
        return 0;
    unsigned char le[8];
    if (f->size < 8 || hub_range_get(c->h, r->name, r->commit, f->path, 0, 8, le, err))
        return f->size < 8 ? errbuf_set(err, "%s: %llu bytes is no safetensors file", f->path, (unsigned long long)f->size)
                           : -1;
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = n << 8 | le[k];
    if (n > (100u << 20) || 8 + n > f->size)
        return errbuf_set(err, "%s@%.12s: %s: a header of %llu bytes in a file of %llu", r->name, r->commit, f->path,
                          (unsigned long long)n, (unsigned long long)f->size);
    unsigned char *hdr = malloc((size_t)n + 8);
    if (!hdr)
        return errbuf_set(err, "out of memory");
    memcpy(hdr, le, 8);
    int rc = hub_range_get(c->h, r->name, r->commit, f->path, 8, n, hdr + 8, err);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (!rc && file_mkdirs_for(path, err))
        rc = -1;
    int fd = rc ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (!rc && (fd < 0 || ftruncate(fd, (off_t)f->size) || file_pwrite_full(fd, hdr, (size_t)n + 8, 0) || fsync(fd)))
        rc = errbuf_errno(err, tmp);
    if (fd >= 0)
        close(fd);
    if (!rc && rename(tmp, path))
        rc = errbuf_errno(err, path);
    if (rc)
        unlink(tmp);
    free(hdr);
    return rc;
}

/* The N experts routed most often so far (dir/heat.bin, the store's routing counts; experts never
 * routed, or all of them before any run, count 0 and follow in layer order), fetched now. */
static int stream_prefetch_hot(stream *st, const blob_table *bt, const char *dir, long n, errbuf *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/heat.bin", dir);
    int64_t *heat = malloc(sizeof *heat * ((size_t)bt->n + 1));
    uint32_t *counts = malloc(4 * ((size_t)bt->n + 1)), nb = 0;
    if (!heat || !counts) {
        free(heat);
        free(counts);
        return errbuf_set(err, "out of memory");
    }
    FILE *f = fopen(path, "rb");
    int got = f && fread(&nb, 4, 1, f) == 1 && nb == (uint32_t)bt->n && fread(counts, 4, nb, f) == nb;
    if (f)
        fclose(f);
    for (int b = 0; b < bt->n; b++) /* -1: not a candidate */
        heat[b] = bt->b[b].kind == BLOB_EXPERT && !stream_present(st, b) ? (got ? (int64_t)counts[b] : 0) : -1;
    free(counts);
    int done = 0, rc = 0;
    for (; done < n && rc == 0; done++) {
        int best = -1;
        for (int b = 0; b < bt->n; b++)
            if (heat[b] >= 0 && (best < 0 || heat[b] > heat[best]))
                best = b;
        if (best < 0)
            break;
        heat[best] = -1;
        rc = stream_fetch(st, best, err);
    }
    free(heat);
    if (rc == 0)
        printf("setup --stream: fetched the %d hottest experts not yet on the drive (%s)\n", done,
               got ? "by the routing counts of earlier runs" : "no runs yet: in layer order");
    return rc;
}

static int setup_stream(setup_ctx *c, long prefetch_hot, errbuf *err)
{
    hub_repo k3 = {0}, ds = {0};
    int *wd = NULL, *small = NULL, nd, ns = 0, rc = -1;
    uint64_t bd, small_bytes = 0, shard_bytes = 0;
    char dir[4200], dsdir[4200], link[4300];
    model m;
    blob_table bt;
    int have_model = 0, have_bt = 0;
    stream *st = NULL;
    json_t *inst = NULL;
    memset(&m, 0, sizeof m);
    memset(&bt, 0, sizeof bt);
    if (repo_get(c, K3_REPO, c->revision, c->revision != NULL, &k3, err) ||
        repo_get(c, DSPARK_REPO, DSPARK_REV, 0, &ds, err))
        goto done;
    snprintf(dir, sizeof dir, "%s/k3-stream", c->root);
    snprintf(dsdir, sizeof dsdir, "%s/k3-dspark", c->root);
    wd = malloc(sizeof(int) * (size_t)(ds.n_files + 1));
    small = malloc(sizeof(int) * (size_t)(k3.n_files + 1));
    if (!wd || !small) {
        errbuf_set(err, "setup: out of memory");
        goto done;
    }
    nd = wanted(&ds, wd, &bd);
    int nshards = 0;
    for (int i = 0; i < k3.n_files; i++) {
        const char *p = k3.files[i].path;
        if (!file_wanted(p))
            continue;
        if (!fnmatch("*.safetensors", p, 0)) {
            nshards++;
            shard_bytes += k3.files[i].size;
        } else {
            small[ns++] = i;
            small_bytes += k3.files[i].size;
        }
    }
    if (c->dry_run) {
        char a[32], b[32], d[32];
        gb(small_bytes, a, sizeof a);
        gb(shard_bytes, b, sizeof b);
        gb(bd, d, sizeof d);
        printf("setup --stream: plan for %s\n", c->root);
        printf("  %s@%s: %d small files (%s) now, then each of %d shards' header and spine (its size is in the "
               "headers: for K3 about 107 GB, checked against the free space before it is fetched); the experts (at "
               "most %s with the spine) as the router first asks for them, into %s\n",
               K3_REPO, k3.commit, ns, a, nshards, b, dir);
        printf("  %s@%s: %d files, %s, into %s\n", DSPARK_REPO, ds.commit, nd, d, dsdir);
        space sp = {.n = 0};
        if (space_add(&sp, dir, small_bytes + bd, err) == 0)
            space_check(&sp, 1, err);
        rc = 0;
        goto done;
    }
    static const char *const mine[] = {STREAM_JSON, "stream.journal", "heat.bin"};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++)
        if (hub_repo_file(&k3, mine[i])) {
            errbuf_set(err, "%s@%.12s has a file named %s, which a streamed install keeps for itself", k3.name,
                       k3.commit, mine[i]);
            goto done;
        }
    space pre = {.n = 0}; /* what comes before the spine (whose size the headers tell: checked then) */
    if (space_add(&pre, dir, bytes_missing(&k3, small, ns, dir), err) ||
        space_add(&pre, dsdir, bytes_missing(&ds, wd, nd, dsdir), err) || space_check(&pre, 0, err))
        goto done;
    if (fetch(c, &ds, wd, nd, dsdir, err) || fetch(c, &k3, small, ns, dir, err))
        goto done;
    for (int i = 0; i < k3.n_files; i++)
        if (file_wanted(k3.files[i].path) && !fnmatch("*.safetensors", k3.files[i].path, 0) &&
            stream_shard_header(c, &k3, &k3.files[i], dir, err))
            goto done;
    if (stream_json_write(dir, &k3, err) || model_load(&m, dir, err))
        goto done;
    have_model = 1;
    if (blob_table_build(&bt, &m, err))
        goto done;
    have_bt = 1;
    if (stream_open(&st, dir, &m, &bt, c->h, 0, err)) /* 0: its spine is what comes next */
        goto done;
    /* the spine: every blob that is not a routed expert, after a check that it fits */
    uint64_t spine_missing = 0;
    for (int b = 0; b < bt.n; b++)
        if (bt.b[b].kind != BLOB_EXPERT && !stream_present(st, b))
            spine_missing += bt.b[b].size;
    space sp = {.n = 0};
    if (space_add(&sp, dir, spine_missing, err) || space_check(&sp, 0, err))
        goto done;
    for (int b = 0; b < bt.n; b++)
        if (bt.b[b].kind != BLOB_EXPERT && stream_fetch(st, b, err))
            goto done;
    stream_counts sc;
    stream_counts_get(st, &sc);
    char a[32];
    gb(sc.bytes_fetched, a, sizeof a);
    printf("setup --stream: %s: config, tokenizer and the spine of %d shards are on the drive (%s fetched now); %d of "
           "%d experts so far\n",
           dir, nshards, a, sc.experts_present, sc.experts);
    if (prefetch_hot > 0 && stream_prefetch_hot(st, &bt, dir, prefetch_hot, err))
        goto done;
    /* run finds its drafters beside the model: DIR-dspark */
    snprintf(link, sizeof link, "%s-dspark", dir);
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", link, (int)getpid());
    unlink(tmp);
    if (symlink("k3-dspark", tmp) || rename(tmp, link)) {
        unlink(tmp);
        errbuf_errno(err, link);
        goto done;
    }
    if (install_load(c, &inst, err))
        goto done;
    json_object_set_new(inst, "k3", install_entry(&k3, "stream", dir));
    json_object_set_new(inst, "dspark", install_entry(&ds, "dir", dsdir));
    if (install_save(c, inst, err))
        goto done;
    printf("setup: installed %s@%.12s to stream in %s; `deltafin run` and `deltafin serve` without --model use it, "
           "fetching each expert the first time it is routed\n",
           K3_REPO, k3.commit, c->root);
    rc = 0;
done:
    json_decref(inst);
    stream_free(st);
    if (have_bt)
        blob_table_free(&bt);
    if (have_model)
        model_free(&m);
    hub_repo_free(&k3);
    hub_repo_free(&ds);
    free(wd);
    free(small);
    return rc;
}

/* ---- --check: every installed part against what was recorded, offline ---- */

/* store_copy: dir is a store or a streamed install, which keep the model's small files (their
 * tensors are checked blob by blob): only the files it has are checked, and never a shard. */
static int check_dir(setup_ctx *c, const json_t *e, const char *key, int store_copy, int *bad)
{
    const char *repo, *dir;
    errbuf err;
    hub_repo r = {0};
    if (jsonr_str(e, "repo", &repo, 0, "install.json", &err) || jsonr_str(e, key, &dir, 0, "install.json", &err)) {
        printf("FAIL install.json: %s\n", err.msg);
        (*bad)++;
        return 0;
    }
    char slug[300], path[4500];
    repo_slug(repo, slug, sizeof slug);
    snprintf(path, sizeof path, "%s/hub/%s.json", c->root, slug);
    if (hub_repo_load(path, &r, &err)) {
        printf("FAIL %s: %s\n", repo, err.msg);
        (*bad)++;
        return 0;
    }
    /* a store keeps the model's small files (its tensors are checked blob by blob); a folder, all */
    int keep = 0;
    for (int i = 0; i < r.n_files; i++) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, r.files[i].path);
        if (file_wanted(r.files[i].path) &&
            (!store_copy || (file_exists(p) && fnmatch("*.safetensors", r.files[i].path, 0))))
            r.files[keep++] = r.files[i];
        else
            free(r.files[i].path);
    }
    r.n_files = keep;
    if (hub_verify(&r, dir, &err)) {
        printf("FAIL %s: %s\n", repo, err.msg);
        (*bad)++;
    } else {
        printf("ok   %s@%.12s: %d files in %s match the hub's sizes and hashes\n", repo, r.commit, keep, dir);
    }
    hub_repo_free(&r);
    return 0;
}

static int setup_check(setup_ctx *c, errbuf *err)
{
    json_t *inst = NULL, *e;
    char path[4200];
    snprintf(path, sizeof path, "%s/install.json", c->root);
    if (!file_exists(path))
        return errbuf_set(err, "%s: nothing is installed in %s (run deltafin setup --full)", path, c->root);
    if (install_load(c, &inst, err))
        return -1;
    int bad = 0;
    if ((e = json_object_get(inst, "k3")) && json_object_get(e, "stream")) {
        const char *dir = NULL;
        errbuf e2;
        engine *en = NULL;
        engine_opts eo;
        engine_opts_default(&eo); /* no hub: offline */
        check_dir(c, e, "stream", 1, &bad);
        if (jsonr_str(e, "stream", &dir, 0, path, &e2) == 0) {
            eo.model = dir;
            eo.threads = 1;
            eo.min_cache = 1;
        }
        stream_counts sc;
        if (!dir || engine_open(&eo, &en, &e2) || !engine_stream(en) || stream_check(engine_stream(en), &e2)) {
            printf("FAIL K3 stream %s: %s\n", dir ? dir : "?", en && !engine_stream(en) ? "not a streamed install" : e2.msg);
            bad++;
        } else {
            stream_counts_get(engine_stream(en), &sc);
            printf("ok   K3 stream %s: %d of %d experts on the drive match their fetch, %d of them unverified (their "
                   "shard not yet whole); %d of %d shards verified against the hub's sha256\n",
                   dir, sc.experts_present, sc.experts, sc.experts_unverified, sc.shards_verified, sc.shards);
        }
        engine_free(en);
    } else if ((e = json_object_get(inst, "k3"))) {
        const char *store = NULL;
        check_dir(c, e, "store", 1, &bad);
        errbuf e2;
        engine *en = NULL;
        engine_opts eo;
        engine_opts_default(&eo);
        if (jsonr_str(e, "store", &store, 0, path, &e2) == 0) {
            eo.model = store;
            eo.threads = 1;
            eo.min_cache = 1;
        }
        if (!store || engine_open(&eo, &en, &e2) || !engine_store(en) || store_verify_all(engine_store(en), &e2)) {
            printf("FAIL K3 store %s: %s\n", store ? store : "?", en && !engine_store(en) ? "not a DFSP store" : e2.msg);
            bad++;
        } else {
            printf("ok   K3 store %s: every copy of every blob matches its checksum\n", store);
        }
        engine_free(en);
    }
    if ((e = json_object_get(inst, "dspark")))
        check_dir(c, e, "dir", 0, &bad);
    json_t *qa = json_object_get(inst, "qwen");
    for (size_t i = 0; json_is_array(qa) && i < json_array_size(qa); i++)
        check_dir(c, json_array_get(qa, i), "dir", 0, &bad);
    json_decref(inst);
    return bad ? errbuf_set(err, "%d part(s) of the install in %s failed the check", bad, c->root) : 0;
}

static int setup_main(int argc, char **argv, int qwen_only)
{
    const char *cmd = qwen_only ? "setup-qwen" : "setup", *v, *root_opt = NULL, *drives = NULL;
    int full = 0, stream = 0, check = 0, include_qwen = 0;
    long mirrors = 1, parallel = 4, prefetch_hot = 0;
    setup_ctx c = {.cmd = cmd, .mirrors = 1};
    for (int i = 1; i < argc; i++) {
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if (!qwen_only && !strcmp(argv[i], "--full")) {
            full = 1;
        } else if (!qwen_only && !strcmp(argv[i], "--stream")) {
            stream = 1;
        } else if (!qwen_only && !strcmp(argv[i], "--check")) {
            check = 1;
        } else if (!qwen_only && !strcmp(argv[i], "--include-qwen")) {
            include_qwen = 1;
        } else if (!qwen_only && !strcmp(argv[i], "--keep-download")) {
            c.keep_download = 1;
        } else if (!strcmp(argv[i], "--dry-run")) {
            c.dry_run = 1;
        } else if ((r = cli_opt(argc, argv, &i, "--model-root", &v))) {
            root_opt = v;
        } else if (!qwen_only && (r = cli_opt(argc, argv, &i, "--drives", &v))) {
            drives = v;
        } else if (!qwen_only && (r = cli_opt(argc, argv, &i, "--revision", &v))) {
            c.revision = v;
        } else if (!qwen_only && (r = cli_opt(argc, argv, &i, "--mirrors", &v))) {
            if (r > 0 && cli_long(cmd, "--mirrors", v, 1, STORE_MAX_COPIES, &mirrors))
                return 2;
        } else if (!qwen_only && (r = cli_opt(argc, argv, &i, "--prefetch-hot", &v))) {
            if (r > 0 && cli_long(cmd, "--prefetch-hot", v, 0, 100000000, &prefetch_hot))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--parallel", &v))) {
            if (r > 0 && cli_long(cmd, "--parallel", v, 1, 64, &parallel))
                return 2;
        } else {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        }
        if (r < 0)
            return cli_usage(cmd, "%s needs a value", argv[i]);
    }
    if (!qwen_only && full + stream + check != 1)
        return cli_usage(cmd, "give one of --full, --stream or --check");
    if (stream && (drives || include_qwen || mirrors > 1))
        return cli_usage(cmd, "--stream keeps the model in the model root: no --drives, --mirrors or --include-qwen");
    if (prefetch_hot && !stream)
        return cli_usage(cmd, "--prefetch-hot goes with --stream");
    errbuf err;
    if (cli_model_root(root_opt, c.root, sizeof c.root, &err))
        return cli_fail(cmd, &err);
    c.mirrors = (int)mirrors;
    if (drives) {
        snprintf(c.drives_buf, sizeof c.drives_buf, "%s", drives);
        char tmp[8192], *save = NULL;
        static char keep[STORE_MAX_PACKS][4096];
        snprintf(tmp, sizeof tmp, "%s", drives);
        for (char *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (c.ndrives == STORE_MAX_PACKS)
                return cli_usage(cmd, "--drives: at most %d folders", STORE_MAX_PACKS);
            snprintf(keep[c.ndrives], sizeof keep[0], "%s", t);
            c.drives[c.ndrives] = keep[c.ndrives];
            c.ndrives++;
        }
    }
    if (c.mirrors > (c.ndrives ? c.ndrives : 1))
        return cli_usage(cmd, "--mirrors %d needs at least as many --drives", c.mirrors);
    int rc;
    if (check) {
        rc = setup_check(&c, &err);
    } else {
        hub_opts_default(&c.ho);
        hub_opts_from_env(&c.ho);
        c.ho.parallel = (int)parallel;
        if (!c.dry_run && file_mkdirs(c.root, &err))
            return cli_fail(cmd, &err);
        char abs[4096];
        if (realpath(c.root, abs)) /* install.json names absolute paths */
            snprintf(c.root, sizeof c.root, "%s", abs);
        if (hub_init(&c.h, &c.ho, &err))
            return cli_fail(cmd, &err);
        rc = qwen_only ? setup_qwen(&c, &err) : stream ? setup_stream(&c, prefetch_hot, &err) : setup_full(&c, include_qwen, &err);
        hub_free(c.h);
    }
    if (rc == DFSP_STOPPED) {
        fprintf(stderr, "deltafin %s: %s\n", cmd, err.msg);
        return 3;
    }
    return rc ? cli_fail(cmd, &err) : 0;
}

int cmd_setup(int argc, char **argv) { return setup_main(argc, argv, 0); }
int cmd_setup_qwen(int argc, char **argv) { return setup_main(argc, argv, 1); }
