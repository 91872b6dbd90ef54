/* hub.h — a Hugging Face hub client on libcurl: resolve a repo to a commit, download its files so
 * that they survive any network, and read byte ranges of them.
 *
 *     hub_opts o;  hub_opts_default(&o);  o.endpoint = ...;  o.token = ...;
 *     hub *h;  hub_init(&h, &o, &err);
 *     hub_repo r;  hub_repo_resolve(h, "moonshotai/Kimi-K3", "main", &r, &err);   // commit + files
 *     hub_download(h, &r, NULL, 0, "DIR", &stats, &err);                      // every file
 *     hub_repo_free(&r);  hub_free(h);
 *
 * The protocol is the hub's own (docs/INSTALL.md): `GET /api/models/{repo}/revision/{rev}?blobs=true`
 * gives the commit and each file's size, git blob id and, for LFS files, sha256; a file is
 * `GET /{repo}/resolve/{commit}/{path}`, which may redirect (relative or absolute, to another host).
 *
 * Invariants:
 *   - A file appears under its own name only complete and verified: its bytes go to
 *     "NAME.incomplete", whose size and hash are checked against the resolution (the LFS sha256, or
 *     the git blob id of a plain file) before it is synced and renamed. A mismatch is deleted and
 *     fetched again, never renamed.
 *   - An existing "NAME" of the resolved size counts as verified (only a verified file gets that
 *     name); an existing "NAME.incomplete" is resumed with a Range request.
 *   - Authorization goes only to the endpoint's own host: a redirect to another host drops it.
 *   - Retries (429, 5xx, resets, stalls, short bodies) back off, honouring Retry-After; 401, 403 and
 *     404 end the download at once with one line saying what to do.
 * A hub and its calls belong to one thread.
 */
#ifndef DF_HUB_HUB_H
#define DF_HUB_HUB_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct hub hub;

typedef struct hub_opts {
    const char *endpoint; /* "https://huggingface.co" when NULL; no trailing slash needed */
    const char *token;    /* sent as "Authorization: Bearer" to the endpoint's host; NULL: none */
    int offline;          /* refuse every network call (HF_HUB_OFFLINE) */
    int parallel;         /* files in flight at once (default 4) */
    int retries;          /* attempts per file after the first (default 10) */
    double backoff_s;     /* first retry's wait, doubled each time up to 30 s (default 0.5) */
    double stall_s;       /* a transfer with no byte for this long is retried (default 30) */
    int progress;         /* 1: a progress line on stderr while it is a terminal */
} hub_opts;

void hub_opts_default(hub_opts *o);
/* The options from the environment huggingface_hub reads: HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE.
 * The caller (main's side) calls this; nothing below reads the environment. */
void hub_opts_from_env(hub_opts *o);

typedef struct hub_file {
    char *path;        /* repo-relative, '/'-separated */
    uint64_t size;
    char sha256[65];   /* lowercase hex of an LFS file's sha256; "" for a plain git file */
    char blob_id[41];  /* the git blob id (sha1 of "blob SIZE\0" + bytes) */
} hub_file;

typedef struct hub_repo {
    char name[256];    /* "owner/name" */
    char commit[41];   /* 40 hex */
    hub_file *files;   /* [n_files], sorted by path */
    int n_files;
} hub_repo;

typedef struct hub_stats {
    uint64_t bytes_fetched;  /* body bytes received, including those thrown away */
    uint64_t bytes_reused;   /* bytes already present (verified files, resumed parts) */
    int files_fetched, files_present;
    int retries;             /* requests repeated after a fault */
    int corrupt;             /* files whose hash did not match and were fetched again */
    double seconds;
} hub_stats;

int hub_init(hub **out, const hub_opts *o, errbuf *err);
void hub_free(hub *h);

/* Resolves repo at rev (a branch, tag or commit) to a commit and its files. */
int hub_repo_resolve(hub *h, const char *repo, const char *rev, hub_repo *out, errbuf *err);
/* The same from a revision answer's JSON text (what hub_repo_resolve parses; fuzzed). */
int hub_repo_parse(const char *json, size_t len, const char *repo, hub_repo *out, errbuf *err);
void hub_repo_free(hub_repo *r);
/* The file of r named path, or NULL. */
const hub_file *hub_repo_file(const hub_repo *r, const char *path);

/* Downloads files which[0..n) of r (every file when which is NULL) into dir/PATH, creating folders;
 * st (may be NULL) receives what it did. */
int hub_download(hub *h, const hub_repo *r, const int *which, int n, const char *dir, hub_stats *st,
                 errbuf *err);

/* Reads bytes [off, off + len) of repo@commit's file path into buf (blocking): a Range request,
 * with the download's redirects, Authorization rule and retries; an answer of 200 (the Range
 * ignored) is read through to the window. Used to stream experts on demand (setup --stream). */
int hub_range_get(hub *h, const char *repo, const char *commit, const char *path, uint64_t off, uint64_t len, void *buf,
                  errbuf *err);

/* The sha256 of fd's first size bytes as lowercase hex: 0, or -1 with errno set. */
int hub_sha256_file(int fd, uint64_t size, char hex[65]);

/* Checks dir/PATH of every file of r against r's size and hash, offline. Returns 0 when all are
 * present and right; otherwise -1 with err naming the first that is not. */
int hub_verify(const hub_repo *r, const char *dir, errbuf *err);

/* Writes an "owner/name" repo's resolution as JSON to path (atomically), and reads it back: an
 * install records what it fetched, so that checking it needs no network. */
int hub_repo_save(const hub_repo *r, const char *path, errbuf *err);
int hub_repo_load(const char *path, hub_repo *out, errbuf *err);

#endif
