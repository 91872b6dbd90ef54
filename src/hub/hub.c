/* hub.c — the hub client of hub.h: the revision JSON, a blocking GET for the API, and parallel
 * resumable downloads on one libcurl multi handle.
 *
 * A download is a job per file, a small state machine driven by the multi loop:
 *
 *     WAIT --(not_before passed, a slot free)--> RUN --(answer)--+--> DONE (verified, renamed)
 *       ^                                                        |
 *       +---- a redirect (at once), a retry (after a backoff) ---+--> fatal: the whole call fails
 *
 * A job has taken `have` bytes of its file, all hashed into `md`: the part file holds the first
 * have - wlen of them and its write buffer the last wlen (flushed when full and whenever a transfer
 * ends, so between transfers the part holds exactly `have`). A retry resumes at `have`
 * (Range: bytes=have-); an answer that cannot continue them (a 200 to a
 * Range, a Content-Range at another offset, more bytes than the file has) restarts the part at 0.
 * Redirects are followed by hand so that Authorization is sent only to the endpoint's host; every
 * attempt starts again from the resolve URL (a CDN's signed URL may have expired).
 */
#include "hub/hub.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "base/timer.h"

#define HUB_MAX_REDIRECTS 10
#define HUB_URL_MAX 8192
#define HUB_PATH_MAX 4096
#define HUB_WBUF (4u << 20)

struct hub {
    hub_opts o;
    char endpoint[1024]; /* without a trailing slash */
    char host[600];      /* the endpoint's origin (url_host): the only one that gets Authorization */
    CURLM *multi;
    CURL *ranges; /* hub_range_get's handle, kept so that its connections are reused */
};

void hub_opts_default(hub_opts *o)
{
    *o = (hub_opts){
        .endpoint = NULL,
        .token = NULL,
        .offline = 0,
        .parallel = 4,
        .retries = 10,
        .backoff_s = 0.5,
        .stall_s = 30,
        .progress = 1,
    };
}

void hub_opts_from_env(hub_opts *o)
{
    const char *v;
    if ((v = getenv("HF_ENDPOINT")) && *v)
        o->endpoint = v;
    if ((v = getenv("HF_TOKEN")) && *v)
        o->token = v;
    if ((v = getenv("HF_HUB_OFFLINE")) && *v && strcmp(v, "0") && strcasecmp(v, "false") && strcasecmp(v, "no"))
        o->offline = 1;
}

/* ---- URLs ---- */

/* The origin of an absolute URL, "scheme://host:port" lowercased with the port made explicit
 * ("" when it has none): Authorization goes only to the endpoint's own origin. */
static void url_host(const char *url, char *out, size_t cap)
{
    out[0] = 0;
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        snprintf(out, cap, "%s://%s:%s", scheme, host, port);
        for (char *p = out; *p; p++)
            if (*p >= 'A' && *p <= 'Z')
                *p = (char)(*p - 'A' + 'a');
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
}

/* Appends s percent-encoded (RFC 3986 unreserved kept; '/' kept when keep_slash). */
static int url_append(char *url, size_t cap, const char *s, int keep_slash)
{
    size_t n = strlen(url);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                    *p == '-' || *p == '_' || *p == '.' || *p == '~' || (keep_slash && *p == '/');
        if (n + 4 >= cap)
            return -1;
        n += (size_t)(plain ? snprintf(url + n, cap - n, "%c", *p) : snprintf(url + n, cap - n, "%%%02X", *p));
    }
    return 0;
}

static int url_resolve(const hub *h, const char *repo, const char *commit, const char *path, char *url, size_t cap)
{
    snprintf(url, cap, "%s/", h->endpoint);
    if (url_append(url, cap, repo, 1) || strlen(url) + 10 >= cap)
        return -1;
    strcat(url, "/resolve/");
    if (url_append(url, cap, commit, 0) || strlen(url) + 2 >= cap)
        return -1;
    strcat(url, "/");
    return url_append(url, cap, path, 1);
}

/* ---- one answer's headers ---- */

typedef struct answer {
    long status;
    char error_code[64];  /* X-Error-Code */
    double retry_after;   /* seconds, 0 when absent */
    int has_range;        /* a Content-Range was given */
    uint64_t range_start;
    int body_started;     /* a byte of this answer's body has been taken */
    char repo_commit[48]; /* X-Repo-Commit */
    char linked_etag[80]; /* X-Linked-Etag, unquoted: an LFS file's sha256 */
    int has_linked_size;
    uint64_t linked_size; /* X-Linked-Size */
    char body[512];       /* the start of an error answer's body */
    size_t body_len;
} answer;

static void answer_reset(answer *a) { memset(a, 0, sizeof *a); }

static size_t on_header(char *buf, size_t size, size_t n, void *user)
{
    answer *a = user;
    size_t len = size * n;
    char line[1024];
    size_t l = len < sizeof line - 1 ? len : sizeof line - 1;
    memcpy(line, buf, l);
    line[l] = 0;
    while (l && (line[l - 1] == '\r' || line[l - 1] == '\n'))
        line[--l] = 0;
    if (!strncmp(line, "HTTP/", 5)) { /* a new answer (an interim 100 included): start over */
        answer_reset(a);
        const char *sp = strchr(line, ' ');
        a->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        return len;
    }
    char *colon = strchr(line, ':');
    if (!colon)
        return len;
    *colon = 0;
    const char *v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    if (!strcasecmp(line, "X-Error-Code")) {
        snprintf(a->error_code, sizeof a->error_code, "%s", v);
    } else if (!strcasecmp(line, "Retry-After")) {
        char *end;
        double s = strtod(v, &end);
        if (end != v && s >= 0)
            a->retry_after = s > 600 ? 600 : s; /* an HTTP date is taken as "the backoff" */
    } else if (!strcasecmp(line, "X-Repo-Commit")) {
        snprintf(a->repo_commit, sizeof a->repo_commit, "%s", v);
    } else if (!strcasecmp(line, "X-Linked-Etag")) {
        if (!strncmp(v, "W/", 2))
            v += 2;
        snprintf(a->linked_etag, sizeof a->linked_etag, "%s", v + (*v == '"'));
        char *q = strchr(a->linked_etag, '"');
        if (q)
            *q = 0;
    } else if (!strcasecmp(line, "X-Linked-Size")) {
        a->has_linked_size = 1;
        a->linked_size = strtoull(v, NULL, 10);
    } else if (!strcasecmp(line, "Content-Range")) {
        unsigned long long start;
        if (sscanf(v, "bytes %llu-", &start) == 1) {
            a->has_range = 1;
            a->range_start = start;
        }
    }
    return len;
}

static void answer_keep_body(answer *a, const char *p, size_t len)
{
    size_t room = sizeof a->body - 1 - a->body_len;
    size_t k = len < room ? len : room;
    memcpy(a->body + a->body_len, p, k);
    a->body_len += k;
    a->body[a->body_len] = 0;
}

/* The one line for an answer that ends a download: what, and what to do. */
static int answer_fail(const answer *a, const char *what, const char *endpoint, errbuf *err)
{
    const char *code = a->error_code[0] ? a->error_code : NULL;
    if (a->status == 401 || a->status == 403)
        return errbuf_set(err,
                          "%s: HTTP %ld from %s%s%s%s: a gated or private repo, or a missing or wrong token; accept the "
                          "repo's terms on the hub and set HF_TOKEN to a token that can read it",
                          what, a->status, endpoint, code ? " (" : "", code ? code : "", code ? ")" : "");
    if (a->status == 404)
        return errbuf_set(err, "%s: not found on %s (HTTP 404%s%s)", what, endpoint, code ? ", " : "", code ? code : "");
    return errbuf_set(err, "%s: HTTP %ld from %s%s%s", what, a->status, endpoint, a->body_len ? ": " : "",
                      a->body_len ? a->body : "");
}

static int status_retryable(long s) { return s == 408 || s == 429 || s >= 500; }

static int curl_retryable(CURLcode c)
{
    return c == CURLE_COULDNT_CONNECT || c == CURLE_PARTIAL_FILE || c == CURLE_RECV_ERROR || c == CURLE_SEND_ERROR ||
           c == CURLE_GOT_NOTHING || c == CURLE_OPERATION_TIMEDOUT || c == CURLE_COULDNT_RESOLVE_HOST ||
           c == CURLE_HTTP2 || c == CURLE_HTTP2_STREAM || c == CURLE_SSL_CONNECT_ERROR;
}

/* A refused connection or an unknown host is seldom a passing fault: few tries. */
static int attempts_for(const hub *h, CURLcode c)
{
    int few = c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST;
    return few && h->o.retries > 2 ? 2 : h->o.retries;
}

static double backoff(const hub *h, int attempt, double retry_after)
{
    double b = h->o.backoff_s;
    for (int i = 1; i < attempt && b < 30; i++)
        b *= 2;
    if (b > 30)
        b = 30;
    return retry_after > b ? retry_after : b;
}

/* The settings every request shares; auth: send the token. */
static struct curl_slist *easy_setup(hub *h, CURL *c, const char *url, int auth, answer *a)
{
    struct curl_slist *hd = curl_slist_append(NULL, "Accept-Encoding: identity");
    if (auth && h->o.token) {
        char line[4200];
        snprintf(line, sizeof line, "Authorization: Bearer %s", h->o.token);
        hd = curl_slist_append(hd, line);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "deltafin/1 (huggingface_hub-compatible)");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)(h->o.stall_s > 1 ? h->o.stall_s : 1));
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
    return hd;
}

int hub_init(hub **out, const hub_opts *o, errbuf *err)
{
    *out = NULL;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return errbuf_set(err, "libcurl: global initialisation failed");
    hub *h = calloc(1, sizeof *h);
    if (!h)
        return errbuf_set(err, "hub: out of memory");
    h->o = *o;
    if (h->o.parallel < 1)
        h->o.parallel = 1;
    snprintf(h->endpoint, sizeof h->endpoint, "%s", o->endpoint ? o->endpoint : "https://huggingface.co");
    for (size_t l = strlen(h->endpoint); l && h->endpoint[l - 1] == '/'; l--)
        h->endpoint[l - 1] = 0;
    url_host(h->endpoint, h->host, sizeof h->host);
    if (!h->host[0] || (strncmp(h->endpoint, "http://", 7) && strncmp(h->endpoint, "https://", 8))) {
        free(h);
        return errbuf_set(err, "HF_ENDPOINT '%s': not an http(s) URL", o->endpoint ? o->endpoint : "");
    }
    h->multi = curl_multi_init();
    if (!h->multi) {
        free(h);
        return errbuf_set(err, "libcurl: cannot create a multi handle");
    }
    *out = h;
    return 0;
}

void hub_free(hub *h)
{
    if (!h)
        return;
    curl_multi_cleanup(h->multi);
    if (h->ranges)
        curl_easy_cleanup(h->ranges);
    free(h);
    curl_global_cleanup();
}

/* ---- the revision JSON ---- */

static int hex_ok(const char *s, size_t n)
{
    if (strlen(s) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* A repo path must stay inside its folder: relative, no "." or ".." part, no empty part. */
static int path_ok(const char *p)
{
    size_t pl = strlen(p);
    if (!*p || *p == '/' || pl >= 1024 || strchr(p, '\\') || (pl >= 11 && !strcmp(p + pl - 11, ".incomplete")))
        return 0; /* (NAME.incomplete is where NAME downloads) */
    for (const char *s = p; *s;) {
        const char *e = strchr(s, '/');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l == 0 || (l == 1 && s[0] == '.') || (l == 2 && s[0] == '.' && s[1] == '.'))
            return 0;
        s += l + (e ? 1 : 0);
        if (e && !*s)
            return 0;
    }
    for (const unsigned char *s = (const unsigned char *)p; *s; s++)
        if (*s < 0x20)
            return 0;
    return 1;
}

static int file_cmp(const void *a, const void *b)
{
    return strcmp(((const hub_file *)a)->path, ((const hub_file *)b)->path);
}

void hub_repo_free(hub_repo *r)
{
    for (int i = 0; i < r->n_files; i++)
        free(r->files[i].path);
    free(r->files);
    memset(r, 0, sizeof *r);
}

int hub_repo_parse(const char *json, size_t len, const char *repo, hub_repo *out, errbuf *err)
{
    memset(out, 0, sizeof *out);
    char where[300];
    snprintf(where, sizeof where, "%s: revision answer", repo);
    json_t *doc = jsonr_load_buf(json, len, where, err);
    if (!doc)
        return -1;
    int rc = -1;
    const char *sha;
    json_t *sib = json_object_get(doc, "siblings");
    if (!json_is_object(doc) || jsonr_str(doc, "sha", &sha, 0, where, err))
        goto done;
    if (!hex_ok(sha, 40)) {
        errbuf_set(err, "%s: 'sha' is not a 40-hex commit id", where);
        goto done;
    }
    if (!json_is_array(sib)) {
        errbuf_set(err, "%s: no 'siblings' list", where);
        goto done;
    }
    snprintf(out->name, sizeof out->name, "%s", repo);
    memcpy(out->commit, sha, 41);
    size_t n = json_array_size(sib);
    if (n > 1000000) {
        errbuf_set(err, "%s: %zu files is more than any model has", where, n);
        goto done;
    }
    out->files = calloc(n ? n : 1, sizeof *out->files);
    if (!out->files) {
        errbuf_set(err, "%s: out of memory", where);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(sib, i), *lfs;
        const char *name, *blob = "", *sha256 = "";
        int64_t size = -1;
        char at[1400];
        snprintf(at, sizeof at, "%s: siblings[%zu]", where, i);
        if (!json_is_object(s) || jsonr_str(s, "rfilename", &name, 0, at, err) ||
            jsonr_int(s, "size", &size, 0, at, err) || jsonr_str(s, "blobId", &blob, 1, at, err))
            goto done;
        if ((lfs = json_object_get(s, "lfs")) && !json_is_null(lfs)) {
            int64_t lsize = -1;
            if (!json_is_object(lfs) || jsonr_str(lfs, "sha256", &sha256, 0, at, err) ||
                jsonr_int(lfs, "size", &lsize, 0, at, err))
                goto done;
            if (!hex_ok(sha256, 64) || lsize != size) {
                errbuf_set(err, "%s ('%s'): its lfs sha256 or size is malformed", at, name);
                goto done;
            }
        }
        if (!path_ok(name) || size < 0 || (*blob && !hex_ok(blob, 40)) || (!*sha256 && !*blob)) {
            errbuf_set(err, "%s ('%.200s'): a bad path, size or hash (a plain file needs its blobId, an LFS file its sha256)",
                       at, name);
            goto done;
        }
        hub_file *f = &out->files[out->n_files++];
        f->size = (uint64_t)size;
        snprintf(f->sha256, sizeof f->sha256, "%s", sha256);
        snprintf(f->blob_id, sizeof f->blob_id, "%s", blob);
        if (!(f->path = strdup(name))) {
            errbuf_set(err, "%s: out of memory", where);
            goto done;
        }
    }
    qsort(out->files, (size_t)out->n_files, sizeof *out->files, file_cmp);
    for (int i = 1; i < out->n_files; i++)
        if (!strcmp(out->files[i].path, out->files[i - 1].path)) {
            errbuf_set(err, "%s: '%s' is listed twice", where, out->files[i].path);
            goto done;
        }
    rc = 0;
done:
    json_decref(doc);
    if (rc)
        hub_repo_free(out);
    return rc;
}

const hub_file *hub_repo_file(const hub_repo *r, const char *path)
{
    hub_file key = {.path = (char *)path};
    return r->n_files ? bsearch(&key, r->files, (size_t)r->n_files, sizeof key, file_cmp) : NULL;
}

int hub_repo_save(const hub_repo *r, const char *path, errbuf *err)
{
    json_t *sib = json_array();
    for (int i = 0; i < r->n_files; i++) {
        const hub_file *f = &r->files[i];
        json_t *s = json_pack("{s:s, s:I}", "rfilename", f->path, "size", (json_int_t)f->size);
        if (f->blob_id[0])
            json_object_set_new(s, "blobId", json_string(f->blob_id));
        if (f->sha256[0])
            json_object_set_new(s, "lfs", json_pack("{s:s, s:I}", "sha256", f->sha256, "size", (json_int_t)f->size));
        json_array_append_new(sib, s);
    }
    json_t *doc = json_pack("{s:s, s:s, s:o}", "id", r->name, "sha", r->commit, "siblings", sib);
    char *txt = doc ? json_dumps(doc, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(doc);
    if (!txt)
        return errbuf_set(err, "%s: out of memory", path);
    int rc = file_write_atomic(path, txt, strlen(txt), err);
    free(txt);
    return rc;
}

int hub_repo_load(const char *path, hub_repo *out, errbuf *err)
{
    char *txt;
    size_t len;
    if (file_read_all(path, &txt, &len, err))
        return -1;
    json_t *doc = jsonr_load_buf(txt, len, path, err);
    const char *id = NULL;
    int rc = -1;
    if (doc && !jsonr_str(doc, "id", &id, 0, path, err))
        rc = hub_repo_parse(txt, len, id, out, err);
    json_decref(doc);
    free(txt);
    return rc ? errbuf_prefix(err, "%s", path) : 0;
}

/* ---- a blocking GET of a small answer (the API), with redirects and retries ---- */

/* One request from start_url on c, redirects followed (Authorization kept only while on the
 * endpoint's origin); before each hop, prepare(c, ctx) sets what the request adds (its range, its
 * write function) and resets what it collects. Returns curl's code of the last hop, with a the
 * last answer's headers; -1 (err) after more than HUB_MAX_REDIRECTS hops. */
static int request_follow(hub *h, CURL *c, const char *start_url, answer *a, void (*prepare)(CURL *c, void *ctx),
                          void *ctx, const char *what, CURLcode *cc, errbuf *err)
{
    char url[HUB_URL_MAX], host[600];
    snprintf(url, sizeof url, "%s", start_url);
    int auth = 1;
    for (int hops = 0;; hops++) {
        answer_reset(a);
        curl_easy_reset(c);
        struct curl_slist *hd = easy_setup(h, c, url, auth, a);
        prepare(c, ctx);
        *cc = curl_easy_perform(c);
        curl_slist_free_all(hd);
        char *loc = NULL;
        if (*cc != CURLE_OK || a->status < 300 || a->status >= 400 ||
            curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &loc) != CURLE_OK || !loc)
            return 0;
        if (hops >= HUB_MAX_REDIRECTS)
            return errbuf_set(err, "%s: more than %d redirects", what, HUB_MAX_REDIRECTS);
        snprintf(url, sizeof url, "%s", loc);
        url_host(url, host, sizeof host);
        auth = auth && !strcmp(host, h->host);
    }
}

typedef struct membuf {
    char *p;
    size_t n, cap;
    answer *a;
} membuf;

static size_t on_mem(char *buf, size_t size, size_t n, void *user)
{
    membuf *m = user;
    size_t len = size * n;
    if (m->a->status >= 300 && m->a->status < 400)
        return len;
    if (m->n + len + 1 > m->cap) {
        if (m->n + len + 1 > (64u << 20))
            return 0; /* no API answer is this big */
        size_t cap = m->cap ? m->cap : 65536;
        while (cap < m->n + len + 1)
            cap *= 2;
        char *p = realloc(m->p, cap);
        if (!p)
            return 0;
        m->p = p;
        m->cap = cap;
    }
    memcpy(m->p + m->n, buf, len);
    m->n += len;
    m->p[m->n] = 0;
    return len;
}

static void prepare_mem(CURL *c, void *ctx)
{
    membuf *m = ctx;
    m->n = 0;
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_mem);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, m);
}

static int hub_get_small(hub *h, const char *start_url, const char *what, membuf *m, errbuf *err)
{
    answer a;
    m->a = &a;
    CURL *c = curl_easy_init();
    if (!c)
        return errbuf_set(err, "libcurl: cannot create a handle");
    int rc = -1;
    for (int attempt = 0;; attempt++) {
        CURLcode cc;
        if (request_follow(h, c, start_url, &a, prepare_mem, m, what, &cc, err))
            goto done;
        if (cc == CURLE_OK && a.status == 200) {
            rc = 0;
            goto done;
        }
        if (cc == CURLE_OK && !status_retryable(a.status)) {
            if (m->n)
                answer_keep_body(&a, m->p, m->n);
            answer_fail(&a, what, h->endpoint, err);
            goto done;
        }
        if ((cc != CURLE_OK && !curl_retryable(cc)) || attempt >= attempts_for(h, cc)) {
            if (cc != CURLE_OK)
                errbuf_set(err, "%s: %s (%s)", what, curl_easy_strerror(cc), h->endpoint);
            else
                answer_fail(&a, what, h->endpoint, err);
            if (attempt >= attempts_for(h, cc))
                errbuf_prefix(err, "gave up after %d attempts", attempt + 1);
            goto done;
        }
        double w = backoff(h, attempt + 1, a.retry_after);
        usleep((useconds_t)(w * 1e6));
    }
done:
    curl_easy_cleanup(c);
    return rc;
}

int hub_repo_resolve(hub *h, const char *repo, const char *rev, hub_repo *out, errbuf *err)
{
    memset(out, 0, sizeof *out);
    char what[600];
    snprintf(what, sizeof what, "%s@%s", repo, rev);
    if (h->o.offline)
        return errbuf_set(err, "%s: HF_HUB_OFFLINE is set, so the hub cannot be asked which files the repo has", what);
    const char *slash = strchr(repo, '/');
    if (!slash || slash == repo || !slash[1] || strchr(slash + 1, '/') || strlen(repo) >= sizeof out->name)
        return errbuf_set(err, "'%s': a repo is named owner/name", repo);
    char url[HUB_URL_MAX];
    snprintf(url, sizeof url, "%s/api/models/", h->endpoint);
    if (url_append(url, sizeof url, repo, 1) || strlen(url) + 12 >= sizeof url)
        return errbuf_set(err, "%s: URL too long", what);
    strcat(url, "/revision/");
    if (url_append(url, sizeof url, rev, 0) || strlen(url) + 12 >= sizeof url)
        return errbuf_set(err, "%s: URL too long", what);
    strcat(url, "?blobs=true");
    membuf m = {0};
    int rc = hub_get_small(h, url, what, &m, err);
    if (rc == 0)
        rc = hub_repo_parse(m.p ? m.p : "", m.n, repo, out, err);
    free(m.p);
    return rc;
}

/* ---- a byte range of a file, blocking ---- */

typedef struct window {
    answer *a;
    uint64_t off, len; /* wanted: [off, off + len) of the file */
    uint64_t pos;      /* the file offset of the next body byte */
    uint64_t got;      /* bytes of the window filled */
    unsigned char *buf;
    int bad;           /* a 206 at another offset */
    char range[64];    /* CURLOPT_RANGE */
} window;

static size_t on_window(char *p, size_t size, size_t n, void *user);
static void prepare_window(CURL *c, void *ctx)
{
    window *w = ctx;
    w->got = 0;
    w->bad = 0;
    curl_easy_setopt(c, CURLOPT_RANGE, w->range);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_window);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, w);
}

static size_t on_window(char *p, size_t size, size_t n, void *user)
{
    window *w = user;
    size_t len = size * n;
    long s = w->a->status;
    if (s >= 300 && s < 400)
        return len;
    if (s != 200 && s != 206) {
        answer_keep_body(w->a, p, len);
        return len;
    }
    if (!w->a->body_started) {
        w->a->body_started = 1;
        w->pos = s == 206 ? (w->a->has_range ? w->a->range_start : UINT64_MAX) : 0;
        if (s == 206 && w->pos != w->off) {
            w->bad = 1;
            return 0;
        }
    }
    /* copy what falls inside the window; stop once it is full */
    uint64_t a = w->pos, b = w->pos + len, lo = w->off > a ? w->off : a, hi = w->off + w->len < b ? w->off + w->len : b;
    if (lo < hi) {
        memcpy(w->buf + (lo - w->off), p + (lo - a), (size_t)(hi - lo));
        w->got += hi - lo;
    }
    w->pos = b;
    /* a 200 carries the whole file: once the window is full the rest is not read (0 aborts it);
     * a 206 ends by itself, keeping its connection for the next range */
    return w->got == w->len && s == 200 ? 0 : len;
}

int hub_range_get(hub *h, const char *repo, const char *commit, const char *path, uint64_t off, uint64_t len, void *buf,
                  errbuf *err)
{
    char what[2048], start[HUB_URL_MAX];
    snprintf(what, sizeof what, "%s@%.12s: %s bytes %llu-%llu", repo, commit, path, (unsigned long long)off,
             (unsigned long long)(off + len - 1));
    if (h->o.offline)
        return errbuf_set(err, "%s: not fetched yet, and HF_HUB_OFFLINE is set", what);
    if (len == 0)
        return 0;
    if (url_resolve(h, repo, commit, path, start, sizeof start))
        return errbuf_set(err, "%s: URL too long", what);
    if (!h->ranges && !(h->ranges = curl_easy_init()))
        return errbuf_set(err, "libcurl: cannot create a handle");
    CURL *c = h->ranges;
    answer a;
    window w = {.a = &a, .off = off, .len = len, .buf = buf};
    snprintf(w.range, sizeof w.range, "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
    int rc = -1;
    for (int attempt = 0;; attempt++) {
        CURLcode cc;
        if (request_follow(h, c, start, &a, prepare_window, &w, what, &cc, err))
            goto done;
        if (w.got == len && (a.status == 200 || a.status == 206)) { /* a full window (a 200 cut short) */
            rc = 0;
            goto done;
        }
        int retry = w.bad || (cc == CURLE_OK && (a.status == 200 || a.status == 206)) /* short */ ||
                    (cc == CURLE_OK && status_retryable(a.status)) || (cc != CURLE_OK && curl_retryable(cc));
        if (cc == CURLE_OK && !retry) {
            answer_fail(&a, what, h->endpoint, err);
            goto done;
        }
        if (!retry || attempt >= attempts_for(h, cc)) {
            if (cc != CURLE_OK && cc != CURLE_WRITE_ERROR)
                errbuf_set(err, "%s: %s (%s)", what, curl_easy_strerror(cc), h->endpoint);
            else
                errbuf_set(err, "%s: %llu of %llu bytes (HTTP %ld)", what, (unsigned long long)w.got,
                           (unsigned long long)len, a.status);
            errbuf_prefix(err, "gave up after %d attempts", attempt + 1);
            goto done;
        }
        usleep((useconds_t)(backoff(h, attempt + 1, a.retry_after) * 1e6));
    }
done:
    return rc;
}

/* ---- hashing ---- */

static int md_start(EVP_MD_CTX *md, const hub_file *f)
{
    if (!EVP_DigestInit_ex(md, f->sha256[0] ? EVP_sha256() : EVP_sha1(), NULL))
        return -1;
    if (!f->sha256[0]) { /* a git blob id hashes its header first */
        char hdr[40];
        int l = snprintf(hdr, sizeof hdr, "blob %llu", (unsigned long long)f->size);
        if (!EVP_DigestUpdate(md, hdr, (size_t)l + 1))
            return -1;
    }
    return 0;
}

/* 1 when the hash of md (consumed) is f's. */
static int md_matches(EVP_MD_CTX *md, const hub_file *f)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    if (!EVP_DigestFinal_ex(md, d, &dl))
        return 0;
    for (unsigned i = 0; i < dl; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return !strcmp(hex, f->sha256[0] ? f->sha256 : f->blob_id);
}

/* Feeds fd's first len bytes to md. */
static int md_file(EVP_MD_CTX *md, int fd, uint64_t len)
{
    static const size_t CH = 1u << 20;
    unsigned char *buf = malloc(CH);
    if (!buf)
        return -1;
    int rc = 0;
    for (uint64_t off = 0; off < len && rc == 0;) {
        size_t k = len - off < CH ? (size_t)(len - off) : CH;
        if (file_pread_full(fd, buf, k, off) || !EVP_DigestUpdate(md, buf, k))
            rc = -1;
        off += k;
    }
    free(buf);
    return rc;
}

int hub_sha256_file(int fd, uint64_t size, char hex[65])
{
    hub_file f = {.size = size, .sha256 = "x"}; /* any sha256: md_start then hashes plain bytes */
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    int rc = md && md_start(md, &f) == 0 && md_file(md, fd, size) == 0 && EVP_DigestFinal_ex(md, d, &dl) ? 0 : -1;
    EVP_MD_CTX_free(md);
    for (unsigned i = 0; rc == 0 && i < dl; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return rc;
}

int hub_verify(const hub_repo *r, const char *dir, errbuf *err)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md)
        return errbuf_set(err, "libcrypto: out of memory");
    int rc = 0;
    for (int i = 0; i < r->n_files && rc == 0; i++) {
        const hub_file *f = &r->files[i];
        char path[HUB_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, f->path);
        struct stat sb;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            rc = errbuf_errno(err, path);
        else if (fstat(fd, &sb) || (uint64_t)sb.st_size != f->size)
            rc = errbuf_set(err, "%s: %lld bytes, the hub says %llu", path, (long long)sb.st_size,
                            (unsigned long long)f->size);
        else if (md_start(md, f) || md_file(md, fd, f->size))
            rc = errbuf_errno(err, path);
        else if (!md_matches(md, f))
            rc = errbuf_set(err, "%s: its %s does not match the hub's (%s@%.12s)", path,
                            f->sha256[0] ? "sha256" : "git blob id", r->name, r->commit);
        if (fd >= 0)
            close(fd);
    }
    EVP_MD_CTX_free(md);
    return rc;
}

/* ---- downloads ---- */

enum job_state { JOB_WAIT, JOB_RUN, JOB_DONE };

typedef struct job {
    hub *h;
    const hub_repo *r;
    const hub_file *f;
    char final[HUB_PATH_MAX], part[HUB_PATH_MAX + 16];
    char url[HUB_URL_MAX];
    int fd;
    uint64_t have;        /* bytes taken, all hashed into md: the part's, then wbuf's */
    unsigned char *wbuf;  /* [HUB_WBUF] bytes not yet written (a write per 16 KiB answer chunk
                             cost more than the hash) */
    size_t wlen;
    EVP_MD_CTX *md;
    int state, attempts, redirects, auth;
    double not_before;
    CURL *easy;
    struct curl_slist *hd;
    answer a;
    int restart;          /* the answer cannot continue the part: start it again at 0 */
    int write_errno;      /* writing the part failed: the download fails */
    hub_stats *st;
} job;

static int job_truncate(job *j)
{
    j->wlen = 0;
    if (ftruncate(j->fd, 0) || md_start(j->md, j->f))
        return -1;
    j->have = 0;
    return 0;
}

/* Writes the buffered bytes to the part file; sets write_errno on failure. */
static int job_flush(job *j)
{
    if (j->wlen && file_pwrite_full(j->fd, j->wbuf, j->wlen, j->have - j->wlen)) {
        j->write_errno = errno ? errno : EIO;
        return -1;
    }
    j->wlen = 0;
    return 0;
}

static size_t on_body(char *buf, size_t size, size_t n, void *user)
{
    job *j = user;
    size_t len = size * n;
    j->st->bytes_fetched += len;
    long s = j->a.status;
    if (s >= 300 && s < 400)
        return len;
    if (s != 200 && s != 206) {
        answer_keep_body(&j->a, buf, len);
        return len;
    }
    if (!j->a.body_started) { /* the first bytes of the body: where do they go? */
        j->a.body_started = 1;
        if (s == 200 && j->have > 0 && job_truncate(j)) { /* the Range was ignored: it starts at 0 */
            j->write_errno = errno ? errno : EIO;
            return 0;
        }
        if (s == 206 && (!j->a.has_range || j->a.range_start != j->have)) {
            j->restart = 1;
            return 0;
        }
    }
    if (j->have + len > j->f->size) {
        j->restart = 1;
        return 0;
    }
    if (j->wlen + len > HUB_WBUF && job_flush(j))
        return 0;
    if (len > HUB_WBUF) { /* never, with curl's buffer sizes; but then straight to the file */
        if (file_pwrite_full(j->fd, buf, len, j->have)) {
            j->write_errno = errno ? errno : EIO;
            return 0;
        }
    } else {
        memcpy(j->wbuf + j->wlen, buf, len);
        j->wlen += len;
    }
    if (!EVP_DigestUpdate(j->md, buf, len)) {
        j->write_errno = ENOMEM;
        return 0;
    }
    j->have += len;
    return len;
}

/* Opens the part file (resuming what it holds) or finds the file already in place. */
static int job_open(job *j, errbuf *err)
{
    struct stat sb;
    if (stat(j->final, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == j->f->size) {
        j->state = JOB_DONE;
        j->st->files_present++;
        j->st->bytes_reused += j->f->size;
        return 0;
    }
    if (j->h->o.offline)
        return errbuf_set(err, "%s: not downloaded yet, and HF_HUB_OFFLINE is set", j->final);
    if (file_mkdirs_for(j->final, err))
        return -1;
    j->fd = open(j->part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (j->fd < 0 || fstat(j->fd, &sb))
        return errbuf_errno(err, j->part);
    if (!(j->md = EVP_MD_CTX_new()) || md_start(j->md, j->f))
        return errbuf_set(err, "libcrypto: cannot start a hash");

    j->have = (uint64_t)sb.st_size;
    if (j->have > j->f->size && job_truncate(j))
        return errbuf_errno(err, j->part);
    if (j->have && md_file(j->md, j->fd, j->have))
        return errbuf_errno(err, j->part);
    j->st->bytes_reused += j->have;
    j->state = JOB_WAIT;
    return 0;
}

static int job_start(job *j, errbuf *err)
{
    if (!j->redirects) {
        if (url_resolve(j->h, j->r->name, j->r->commit, j->f->path, j->url, sizeof j->url))
            return errbuf_set(err, "%s: URL too long", j->f->path);
        j->auth = 1;
    }
    answer_reset(&j->a);
    j->restart = 0;
    if (!j->wbuf && !(j->wbuf = malloc(HUB_WBUF))) /* only while it runs: 4 MiB x files in flight */
        return errbuf_set(err, "%s: out of memory", j->part);
    if (!j->easy && !(j->easy = curl_easy_init()))
        return errbuf_set(err, "libcurl: cannot create a handle");
    curl_easy_reset(j->easy);
    curl_slist_free_all(j->hd);
    j->hd = easy_setup(j->h, j->easy, j->url, j->auth, &j->a);
    char range[64];
    if (j->have > 0) {
        snprintf(range, sizeof range, "%llu-", (unsigned long long)j->have);
        curl_easy_setopt(j->easy, CURLOPT_RANGE, range);
    }
    curl_easy_setopt(j->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(j->easy, CURLOPT_WRITEDATA, j);
    curl_easy_setopt(j->easy, CURLOPT_PRIVATE, j);
    if (curl_multi_add_handle(j->h->multi, j->easy) != CURLM_OK)
        return errbuf_set(err, "libcurl: cannot start a transfer");
    j->state = JOB_RUN;
    return 0;
}

/* The part is complete: check it and put it in place. 1: done; 0: it was corrupt (restarted). */
static int job_finish(job *j, errbuf *err)
{
    if (!md_matches(j->md, j->f)) {
        j->st->corrupt++;
        if (job_truncate(j))
            return errbuf_errno(err, j->part);
        return 0;
    }
    if (fsync(j->fd) || close(j->fd)) { /* a late ENOSPC: nothing half-written stays */
        errbuf_errno(err, j->part);
        j->fd = -1;
        unlink(j->part);
        return -1;
    }
    j->fd = -1;
    if (rename(j->part, j->final))
        return errbuf_errno(err, j->final);
    char d[HUB_PATH_MAX];
    snprintf(d, sizeof d, "%s", j->final);
    char *slash = strrchr(d, '/');
    if (slash) {
        *slash = 0;
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    j->state = JOB_DONE;
    j->st->files_fetched++;
    free(j->wbuf);
    j->wbuf = NULL;
    return 1;
}

/* What the resolve answer says of the file (X-Repo-Commit, X-Linked-Etag, X-Linked-Size) must be
 * what the revision said: otherwise the hub moved under us, and nothing fetched can be trusted. */
static int answer_matches(const answer *a, const hub_repo *r, const hub_file *f, const char *what, errbuf *err)
{
    if (a->repo_commit[0] && strcmp(a->repo_commit, r->commit))
        return errbuf_set(err, "%s: the hub answered for commit %.40s, not the resolved %s", what, a->repo_commit,
                          r->commit);
    if (a->linked_etag[0] && f->sha256[0] && strcmp(a->linked_etag, f->sha256))
        return errbuf_set(err, "%s: the hub's X-Linked-Etag %s is not the sha256 %s it resolved", what, a->linked_etag,
                          f->sha256);
    if (a->has_linked_size && f->sha256[0] && a->linked_size != f->size)
        return errbuf_set(err, "%s: the hub's X-Linked-Size %llu is not the %llu bytes it resolved", what,
                          (unsigned long long)a->linked_size, (unsigned long long)f->size);
    return 0;
}

/* A transfer ended: decide what comes next. */
static int job_done(job *j, CURLcode cc, errbuf *err)
{
    hub *h = j->h;
    curl_multi_remove_handle(h->multi, j->easy);
    const char *what = j->final;
    job_flush(j);
    if (cc == CURLE_OK && !j->redirects && answer_matches(&j->a, j->r, j->f, what, err))
        return -1;
    if (j->write_errno) {
        errno = j->write_errno;
        errbuf_errno(err, j->part);
        close(j->fd);
        j->fd = -1;
        unlink(j->part); /* nothing half-written stays behind */
        return -1;
    }
    long s = j->a.status;
    char *loc = NULL;
    if (cc == CURLE_OK && s >= 300 && s < 400 && curl_easy_getinfo(j->easy, CURLINFO_REDIRECT_URL, &loc) == CURLE_OK &&
        loc) {
        if (++j->redirects > HUB_MAX_REDIRECTS)
            return errbuf_set(err, "%s: more than %d redirects", what, HUB_MAX_REDIRECTS);
        char host[600];
        snprintf(j->url, sizeof j->url, "%s", loc);
        url_host(j->url, host, sizeof host);
        j->auth = j->auth && !strcmp(host, h->host);
        j->state = JOB_WAIT;
        j->not_before = 0;
        return 0;
    }
    j->redirects = 0;
    if (j->restart == 1 && job_truncate(j))
        return errbuf_errno(err, j->part);
    int complete = j->have == j->f->size &&
                   ((cc == CURLE_OK && (s == 200 || s == 206)) || (cc == CURLE_OK && s == 416) ||
                    (j->f->size == 0 && cc == CURLE_OK && s == 200));
    if (complete) {
        int r = job_finish(j, err);
        if (r != 0)
            return r < 0 ? -1 : 0;
    } else if (cc == CURLE_OK && s == 416) {
        if (job_truncate(j)) /* past the end of what the hub has: start again */
            return errbuf_errno(err, j->part);
    } else if (cc == CURLE_OK && s != 200 && s != 206 && !status_retryable(s)) {
        return answer_fail(&j->a, what, h->endpoint, err);
    } else if (cc != CURLE_OK && cc != CURLE_WRITE_ERROR && !curl_retryable(cc)) {
        return errbuf_set(err, "%s: %s (%s)", what, curl_easy_strerror(cc), h->endpoint);
    }
    /* a retry: a short or broken body, a corrupt file, a restart, 429 or 5xx */
    if (++j->attempts > attempts_for(h, cc)) {
        if (cc != CURLE_OK)
            return errbuf_set(err, "%s: gave up after %d attempts: %s", what, j->attempts, curl_easy_strerror(cc));
        if (s != 200 && s != 206)
            return answer_fail(&j->a, what, h->endpoint, err), errbuf_prefix(err, "gave up after %d attempts", j->attempts);
        return errbuf_set(err, "%s: gave up after %d attempts (last: %llu of %llu bytes, hash %s)", what, j->attempts,
                          (unsigned long long)j->have, (unsigned long long)j->f->size,
                          j->have == j->f->size ? "wrong" : "unchecked");
    }
    j->st->retries++;
    j->state = JOB_WAIT;
    j->not_before = timer_now() + backoff(h, j->attempts, j->a.retry_after);
    return 0;
}

static void job_free(job *j)
{
    if (j->easy) {
        curl_multi_remove_handle(j->h->multi, j->easy);
        curl_easy_cleanup(j->easy);
    }
    curl_slist_free_all(j->hd);
    if (j->fd >= 0)
        close(j->fd);
    EVP_MD_CTX_free(j->md);
    free(j->wbuf);
}

static void fmt_bytes(double b, char *out, size_t cap)
{
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int k = 0;
    while (b >= 1000 && k < 4) {
        b /= 1000;
        k++;
    }
    snprintf(out, cap, k ? "%.1f %s" : "%.0f %s", b, u[k]);
}

static void progress_line(const hub_repo *r, const job *jobs, int n, uint64_t total, double t0, double *rate,
                          uint64_t *last_bytes, double *last_t, int end)
{
    uint64_t done = 0;
    int running = 0;
    for (int i = 0; i < n; i++) {
        done += jobs[i].state == JOB_DONE ? jobs[i].f->size : jobs[i].have;
        running += jobs[i].state == JOB_RUN;
    }
    double now = timer_now();
    if (now > *last_t) {
        double inst = (double)(done - (done >= *last_bytes ? *last_bytes : done)) / (now - *last_t);
        *rate = *rate > 0 ? 0.7 * *rate + 0.3 * inst : inst;
    }
    *last_bytes = done;
    *last_t = now;
    char a[32], b[32], c[32], eta[32] = "-";
    fmt_bytes((double)done, a, sizeof a);
    fmt_bytes((double)total, b, sizeof b);
    fmt_bytes(end ? (double)done / (now - t0 > 1e-9 ? now - t0 : 1e-9) : *rate, c, sizeof c);
    if (!end && *rate > 1 && total > done) {
        long sec = (long)((double)(total - done) / *rate);
        if (sec >= 3600)
            snprintf(eta, sizeof eta, "%ldh%02ldm", sec / 3600, sec / 60 % 60);
        else
            snprintf(eta, sizeof eta, "%ldm%02lds", sec / 60, sec % 60);
    }
    fprintf(stderr, "\r%s: %s / %s  %s/s  ETA %s  (%d in flight)   %s", r->name, a, b, c, eta, running, end ? "\n" : "");
}

int hub_download(hub *h, const hub_repo *r, const int *which, int n, const char *dir, hub_stats *st, errbuf *err)
{
    hub_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    double t0 = timer_now();
    if (!which)
        n = r->n_files;
    job *jobs = calloc((size_t)(n ? n : 1), sizeof *jobs);
    if (!jobs)
        return errbuf_set(err, "hub: out of memory");
    int rc = 0;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        j->h = h;
        j->r = r;
        j->st = st;
        j->fd = -1;
        j->f = &r->files[which ? which[i] : i];
        if ((size_t)snprintf(j->final, sizeof j->final, "%s/%s", dir, j->f->path) >= sizeof j->final) {
            rc = errbuf_set(err, "%s/%s: the path is too long", dir, j->f->path);
            continue;
        }
        snprintf(j->part, sizeof j->part, "%s.incomplete", j->final);
        total += j->f->size;
        if (rc == 0 && job_open(j, err))
            rc = -1;
    }
    int tty = h->o.progress && isatty(2);
    double rate = 0, last_t = t0, last_p = 0;
    uint64_t last_b = 0;
    while (rc == 0) {
        int running = 0, waiting = 0;
        double now = timer_now(), next = now + 1;
        for (int i = 0; i < n; i++)
            running += jobs[i].state == JOB_RUN;
        for (int i = 0; i < n && rc == 0; i++) {
            job *j = &jobs[i];
            if (j->state != JOB_WAIT)
                continue;
            waiting++;
            if (j->not_before <= now && running < h->o.parallel) {
                if (job_start(j, err))
                    rc = -1;
                running++;
            } else if (j->not_before > now && j->not_before < next) {
                next = j->not_before;
            }
        }
        if (rc || (!running && !waiting))
            break;
        int still = 0;
        if (curl_multi_perform(h->multi, &still) != CURLM_OK) {
            rc = errbuf_set(err, "libcurl: the transfer loop failed");
            break;
        }
        CURLMsg *msg;
        int left;
        while (rc == 0 && (msg = curl_multi_info_read(h->multi, &left)))
            if (msg->msg == CURLMSG_DONE) {
                job *j = NULL;
                curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&j);
                if (job_done(j, msg->data.result, err))
                    rc = -1;
            }
        if (rc)
            break;
        /* a redirect or a retry due now starts at once, not after the poll's timeout */
        now = timer_now();
        int due = 0, in_flight = 0, unfinished = 0;
        for (int i = 0; i < n; i++) {
            due |= jobs[i].state == JOB_WAIT && jobs[i].not_before <= now;
            in_flight += jobs[i].state == JOB_RUN;
            unfinished += jobs[i].state != JOB_DONE;
            if (jobs[i].state == JOB_WAIT && jobs[i].not_before > now && jobs[i].not_before < next)
                next = jobs[i].not_before;
        }
        if (!unfinished)
            break;
        if (due && in_flight < h->o.parallel)
            continue;
        /* sockets wake the poll; the timeout is for the next retry due (and curl's own timers) */
        double wait_ms = (next - now) * 1000, cap = in_flight ? 100 : 1000;
        curl_multi_poll(h->multi, NULL, 0, (int)(wait_ms < 1 ? 1 : wait_ms > cap ? cap : wait_ms), NULL);
        if (tty && timer_now() - last_p > 0.25) {
            progress_line(r, jobs, n, total, t0, &rate, &last_b, &last_t, 0);
            last_p = timer_now();
        }
    }
    if (tty && rc == 0 && total)
        progress_line(r, jobs, n, total, t0, &rate, &last_b, &last_t, 1);
    else if (tty && total)
        fputc('\n', stderr);
    for (int i = 0; i < n; i++)
        job_free(&jobs[i]);
    free(jobs);
    st->seconds = timer_now() - t0;
    return rc;
}
