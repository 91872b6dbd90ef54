/* test_harden.c — the defects a bad-input campaign found, each with the test that failed before
 * its fix, through the CLI a user runs:
 *   - a flipped byte in a blob served from the mapping (globals, a spine, an expert) is an error
 *     naming the blob, with and without --ram-budget (--no-verify is the explicit opt-out);
 *   - a mirrored store opens with one pack truncated or missing (a warning naming drive and pack)
 *     and computes the same logits; with a bad mapped copy it uses the mirror; without another
 *     copy the error names the blob;
 *   - a store prepared with relative paths opens from anywhere, a store moved as a whole opens,
 *     and a moved drive folder is named with what was looked for until --drives says where;
 *   - --logits-out into a FIFO, a symlink, a character device and a full device;
 *   - NaN weights: an error naming the position, and doctor naming tensor, row and column;
 *   - --max-new 10^9 starts at once and holds memory for what it generated;
 *   - config values out of range, each a one-line error naming the field. */
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "model/model.h"
#include "test.h"
#include "test_util.h"

static const char *TOKENS = "5,6,7,8,9,10,11,12";

static char *tmp_path(const char *name)
{
    static char d[8][4096];
    static int k;
    char *p = d[k++ % 8];
    snprintf(p, 4096, "%s/%s", test_tmpdir(), name);
    return p;
}

static int sh(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sh(char *out, size_t cap, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return tu_run(cmd, out, cap);
}

/* the reference logits of TOKENS from the bundled model (a Hugging Face folder) */
static int reference(const char *path)
{
    char out[4096];
    return sh(out, sizeof out, "%s eval --model models/default --tokens %s --logits-out %s", tu_bin(), TOKENS, path);
}

static int same_file(const char *a, const char *b)
{
    char *x, *y;
    size_t nx, ny;
    errbuf err;
    if (file_read_all(a, &x, &nx, &err) || file_read_all(b, &y, &ny, &err))
        return 0;
    int same = nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

/* a blob of a store's manifest: where copy `copy` lies and how big it is */
static int blob_at(const char *store, const char *kind, int layer, int expert, int copy, char *pack, size_t cap,
                   long long *off, long long *size)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", store);
    json_t *m = json_load_file(path, 0, NULL), *blobs = json_object_get(m, "blobs");
    int found = 0;
    for (size_t i = 0; i < json_array_size(blobs) && !found; i++) {
        json_t *b = json_array_get(blobs, i);
        if (strcmp(json_string_value(json_object_get(b, "kind")), kind) ||
            json_integer_value(json_object_get(b, "layer")) != layer ||
            json_integer_value(json_object_get(b, "expert")) != expert)
            continue;
        json_t *c = json_array_get(json_object_get(b, "copies"), (size_t)copy);
        int p = (int)json_integer_value(json_array_get(c, 0));
        *off = json_integer_value(json_array_get(c, 1));
        *size = json_integer_value(json_object_get(b, "size"));
        snprintf(pack, cap, "%s",
                 json_string_value(json_object_get(json_array_get(json_object_get(m, "packs"), (size_t)p), "path")));
        found = 1;
    }
    json_decref(m);
    return found;
}

static void flip(const char *path, long long off)
{
    int fd = open(path, O_RDWR);
    unsigned char c;
    if (fd >= 0 && pread(fd, &c, 1, off) == 1) {
        c ^= 0x20;
        if (pwrite(fd, &c, 1, off) != 1)
            perror(path);
    }
    if (fd >= 0)
        close(fd);
}

/* bytes of weights outside the experts (globals and spines), from the manifest */
static long long spine_bytes(const char *store)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", store);
    json_t *m = json_load_file(path, 0, NULL), *blobs = json_object_get(m, "blobs");
    long long n = 0;
    for (size_t i = 0; i < json_array_size(blobs); i++) {
        json_t *b = json_array_get(blobs, i);
        if (strcmp(json_string_value(json_object_get(b, "kind")), "expert"))
            n += (json_integer_value(json_object_get(b, "size")) + 4095) / 4096 * 4096;
    }
    json_decref(m);
    return n;
}

/* A byte flipped in a blob the run uses from the mapping: an error naming the blob, whatever the
 * budget; the spine resident and the experts streaming with --ram-budget. */
static void mapped_corruption(const char *kind, int layer, int expert, const char *needle)
{
    char out[16384], name[64], pack[4096];
    snprintf(name, sizeof name, "harden-%s", kind);
    char *st = tmp_path(name);
    long long off, size;
    CHECKF(sh(out, sizeof out, "rm -rf %s && %s prepare --model models/default --out %s", st, tu_bin(), st) == 0,
           "%s", out);
    CHECK(blob_at(st, kind, layer, expert, 0, pack, sizeof pack, &off, &size));
    long long budget = spine_bytes(st) + 16 * 65536;
    for (int b = 0; b < 2; b++) {
        char budget_opt[64] = "";
        if (b)
            snprintf(budget_opt, sizeof budget_opt, "--ram-budget %lld", budget);
        flip(pack, off + size / 2);
        int rc = sh(out, sizeof out, "%s eval --model %s %s --tokens %s --logits-out %s", tu_bin(), st, budget_opt,
                    TOKENS, tmp_path("harden-x.bin"));
        int rc2 = sh(out + strlen(out), sizeof out - strlen(out), "%s eval --model %s %s --tokens %s --no-verify "
                     "--logits-out %s", tu_bin(), st, budget_opt, TOKENS, tmp_path("harden-x.bin"));
        flip(pack, off + size / 2);
        CHECKF(rc == 1 && strstr(out, needle) && strstr(out, "checksum"), "%s %s: status %d: %s", needle, budget_opt,
               rc, out);
        CHECKF(rc2 == 0, "--no-verify %s: status %d: %s", budget_opt, rc2, out); /* the opt-out */
    }
}

TEST(harden_mapped_corruption_globals) { mapped_corruption("global", -1, -1, "blob 'globals'"); }
TEST(harden_mapped_corruption_spine) { mapped_corruption("spine", 3, -1, "blob 'layer 3 spine'"); }

/* an expert is mapped when nothing streams; with a budget it is read into a slot and checked
 * there, so every expert of layer 1 is damaged (the tokens use some of them) */
TEST(harden_mapped_corruption_expert)
{
    char out[16384], *st = tmp_path("harden-expert"), pack[4096];
    long long off, size;
    CHECKF(sh(out, sizeof out, "rm -rf %s && %s prepare --model models/default --out %s", st, tu_bin(), st) == 0,
           "%s", out);
    CHECK(blob_at(st, "expert", 1, 5, 0, pack, sizeof pack, &off, &size));
    flip(pack, off + size / 2);
    int rc = sh(out, sizeof out, "%s eval --model %s --tokens %s --logits-out %s", tu_bin(), st, TOKENS,
                tmp_path("harden-x.bin"));
    flip(pack, off + size / 2);
    CHECKF(rc == 1 && strstr(out, "blob 'layer 1 expert 5'") && strstr(out, "checksum"), "status %d: %s", rc, out);
    for (int e = 0; e < 64; e++)
        if (blob_at(st, "expert", 1, e, 0, pack, sizeof pack, &off, &size))
            flip(pack, off + size / 2);
    rc = sh(out, sizeof out, "%s eval --model %s --ram-budget %lld --tokens %s --logits-out %s", tu_bin(), st,
            spine_bytes(st) + 16 * 65536, TOKENS, tmp_path("harden-x.bin"));
    CHECKF(rc == 1 && strstr(out, "layer 1 expert") && strstr(out, "checksum"), "status %d: %s", rc, out);
}

/* a store on two drives with two copies of every blob */
static char *mirrored(const char *name, int mirrors)
{
    char out[16384], *st = tmp_path(name);
    int rc = sh(out, sizeof out, "rm -rf %s %s-d0 %s-d1 && mkdir -p %s-d0 %s-d1 && %s prepare --model models/default "
                "--out %s --drives %s-d0,%s-d1 --mirrors %d",
                st, st, st, st, st, tu_bin(), st, st, st, mirrors);
    if (rc != 0) {
        fprintf(stderr, "%s\n", out);
        return NULL;
    }
    return st;
}

static const char *pack_of(const char *st, int drive, char *buf, size_t cap)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", st);
    json_t *m = json_load_file(path, 0, NULL);
    snprintf(buf, cap, "%s", json_string_value(json_object_get(json_array_get(json_object_get(m, "packs"),
                                                                               (size_t)drive), "path")));
    json_decref(m);
    return buf;
}

TEST(harden_mirror_pack_truncated_or_missing)
{
    char out[16384], pk[4096], *ref = tmp_path("harden-ref.bin"), *got = tmp_path("harden-got.bin");
    CHECK(reference(ref) == 0);
    char *st = mirrored("harden-mirror", 2);
    CHECK(st);
    pack_of(st, 1, pk, sizeof pk);
    CHECK(truncate(pk, 4096) == 0); /* drive 1's pack cut short */
    for (int budget = 0; budget < 2; budget++) {
        int rc = sh(out, sizeof out, "%s eval --model %s %s --tokens %s --logits-out %s", tu_bin(), st,
                    budget ? "--ram-budget 11M" : "", TOKENS, got);
        CHECKF(rc == 0 && strstr(out, "warning") && strstr(out, "drive 1") && strstr(out, "truncated") &&
                   strstr(out, strrchr(pk, '/') + 1),
               "status %d: %s", rc, out);
        CHECKF(same_file(got, ref), "logits from the mirror differ (budget %d)", budget);
    }
    CHECK(unlink(pk) == 0); /* and now missing */
    int rc = sh(out, sizeof out, "%s eval --model %s --tokens %s --logits-out %s", tu_bin(), st, TOKENS, got);
    CHECKF(rc == 0 && strstr(out, "drive 1") && strstr(out, "missing") && same_file(got, ref), "status %d: %s", rc,
           out);
    /* doctor names the copy that is gone */
    rc = sh(out, sizeof out, "%s doctor --model %s", tu_bin(), st);
    CHECKF(rc == 1 && strstr(out, "cannot be read") && strstr(out, strrchr(pk, '/') + 1), "doctor: %d: %s", rc, out);
    /* both packs gone: nothing to read a blob from */
    CHECK(unlink(pack_of(st, 0, pk, sizeof pk)) == 0);
    rc = sh(out, sizeof out, "%s eval --model %s --tokens %s --logits-out %s", tu_bin(), st, TOKENS, got);
    CHECKF(rc == 1 && strstr(out, "has no copy that can be read") && strstr(out, "blob '"), "status %d: %s", rc, out);
}

TEST(harden_no_mirror_names_the_blob)
{
    char out[16384], pk[4096];
    char *st = mirrored("harden-nomirror", 1);
    CHECK(st);
    CHECK(truncate(pack_of(st, 1, pk, sizeof pk), 4096) == 0);
    int rc = sh(out, sizeof out, "%s eval --model %s --tokens %s --logits-out %s", tu_bin(), st, TOKENS,
                tmp_path("harden-x.bin"));
    CHECKF(rc == 1 && strstr(out, "blob '") && strstr(out, "has no copy") && strstr(out, "truncated"), "status %d: %s",
           rc, out);
}

/* a flipped byte in the mapped copy of the globals: the mirror's bytes are used, the logits right */
TEST(harden_mirror_replaces_a_bad_mapped_copy)
{
    char out[16384], pack[4096], *ref = tmp_path("harden-ref2.bin"), *got = tmp_path("harden-got2.bin");
    long long off, size;
    CHECK(reference(ref) == 0);
    char *st = mirrored("harden-badcopy", 2);
    CHECK(st);
    CHECK(blob_at(st, "global", -1, -1, 0, pack, sizeof pack, &off, &size));
    flip(pack, off + 12345);
    int rc = sh(out, sizeof out, "%s eval --model %s --tokens %s --logits-out %s", tu_bin(), st, TOKENS, got);
    CHECKF(rc == 0 && strstr(out, "failed its checksum; using its mirror"), "status %d: %s", rc, out);
    CHECKF(same_file(got, ref), "logits with the mirror differ");
}

/* prepare with relative --out and --drives (run from a temp folder), then open from the
 * repository; move the whole store; move a drive folder and say where with --drives */
TEST(harden_relative_and_moved_drives)
{
    char out[16384], cwd[4096], *ref = tmp_path("harden-ref3.bin"), *got = tmp_path("harden-got3.bin");
    CHECK(reference(ref) == 0 && getcwd(cwd, sizeof cwd));
    char *w = tmp_path("harden-rel");
    char bin[4200];
    snprintf(bin, sizeof bin, "%s%s%s", tu_bin()[0] == '/' ? "" : cwd, tu_bin()[0] == '/' ? "" : "/", tu_bin());
    int rc = sh(out, sizeof out, "rm -rf %s && mkdir -p %s/d0 %s/d1 && cd %s && %s prepare --model %s/models/default "
                "--out st --drives d0,d1", w, w, w, w, bin, cwd);
    CHECKF(rc == 0, "%s", out);
    rc = sh(out, sizeof out, "%s eval --model %s/st --tokens %s --logits-out %s", tu_bin(), w, TOKENS, got);
    CHECKF(rc == 0 && same_file(got, ref), "a store prepared with relative drives: status %d: %s", rc, out);
    /* the drives move: named with what was looked for, then found with --drives */
    rc = sh(out, sizeof out, "mv %s/d1 %s/d1-moved && %s eval --model %s/st --tokens %s --logits-out %s", w, w, tu_bin(),
            w, TOKENS, got);
    CHECKF(rc == 1 && strstr(out, "drive 1") && strstr(out, "missing") && strstr(out, "--drives"), "status %d: %s", rc,
           out);
    rc = sh(out, sizeof out, "%s eval --model %s/st --drives %s/d0,%s/d1-moved --tokens %s --logits-out %s", tu_bin(),
            w, w, w, TOKENS, got);
    CHECKF(rc == 0 && same_file(got, ref), "--drives to the moved folder: status %d: %s", rc, out);
    /* a store with its pack inside moves as a whole */
    char *s2 = tmp_path("harden-whole");
    rc = sh(out, sizeof out, "rm -rf %s %s-moved && %s prepare --model models/default --out %s && mv %s %s-moved && "
            "%s eval --model %s-moved --tokens %s --logits-out %s", s2, s2, tu_bin(), s2, s2, s2, tu_bin(), s2, TOKENS,
            got);
    CHECKF(rc == 0 && same_file(got, ref), "a store moved whole: status %d: %s", rc, out);
}

/* --logits-out: a FIFO gets the bytes and stays a FIFO; a symlink's target gets them and the link
 * stays; a character device stays one (root only: a private node); a full device is an error;
 * a directory is refused */
TEST(harden_outputs_never_clobber)
{
    char out[16384], *ref = tmp_path("harden-ref4.bin");
    CHECK(reference(ref) == 0);
    char *fifo = tmp_path("harden-fifo"), *got = tmp_path("harden-from-fifo.bin");
    unlink(fifo);
    CHECK(mkfifo(fifo, 0600) == 0);
    /* the reader holds nothing of ours open, and gives up if the FIFO is replaced under it */
    int rc = sh(out, sizeof out, "(timeout 20 cat %s > %s 2>/dev/null &) && %s eval --model models/default --tokens %s "
                "--logits-out %s && sleep 0.3", fifo, got, tu_bin(), TOKENS, fifo);
    struct stat st;
    CHECKF(rc == 0 && stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "FIFO: status %d: %s", rc, out);
    CHECKF(same_file(got, ref), "what came through the FIFO differs");
    char *target = tmp_path("harden-target.bin"), *link = tmp_path("harden-link.bin");
    unlink(link);
    unlink(target);
    CHECK(symlink(target, link) == 0); /* dangling: the target is made */
    rc = sh(out, sizeof out, "%s eval --model models/default --tokens %s --logits-out %s", tu_bin(), TOKENS, link);
    CHECKF(rc == 0 && lstat(link, &st) == 0 && S_ISLNK(st.st_mode) && same_file(target, ref), "symlink: %d: %s", rc,
           out);
    rc = sh(out, sizeof out, "%s eval --model models/default --tokens %s --logits-out /dev/full", tu_bin(), TOKENS);
    CHECKF(rc == 1 && strstr(out, "/dev/full") && strstr(out, "No space"), "/dev/full: status %d: %s", rc, out);
    CHECKF(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode), "/dev/full is no longer a device");
    rc = sh(out, sizeof out, "%s eval --model models/default --tokens %s --logits-out %s", tu_bin(), TOKENS,
            test_tmpdir());
    CHECKF(rc == 1 && strstr(out, "a directory"), "a directory: status %d: %s", rc, out);
    if (geteuid() == 0) { /* a null device node of our own */
        char *node = tmp_path("harden-null");
        unlink(node);
        CHECK(mknod(node, S_IFCHR | 0666, makedev(1, 3)) == 0);
        rc = sh(out, sizeof out, "%s eval --model models/default --tokens %s --logits-out %s", tu_bin(), TOKENS, node);
        CHECKF(rc == 0 && stat(node, &st) == 0 && S_ISCHR(st.st_mode), "device node: status %d: %s", rc, out);
    }
}

/* a copy of the bundled model with one tensor all NaN */
static char *nan_model(void)
{
    char *d = tmp_path("harden-nan"), out[4096];
    if (sh(out, sizeof out, "rm -rf %s && mkdir -p %s && cp models/default/*.json models/default/tiktoken.model "
           "models/default/model.safetensors %s/", d, d, d) != 0)
        return NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    file_map fm;
    errbuf err;
    if (file_map_open(&fm, path, &err))
        return NULL;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | fm.data[i];
    json_t *h = json_loadb((const char *)fm.data + 8, hl, 0, NULL);
    json_t *t = json_object_get(h, "language_model.model.layers.2.self_attn.o_proj.weight");
    long long b = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0)) + 8 + (long long)hl;
    long long e = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 1)) + 8 + (long long)hl;
    json_decref(h);
    file_map_close(&fm);
    int fd = open(path, O_RDWR);
    static const unsigned char nan_bf16[2] = {0xC0, 0x7F};
    for (long long o = b; fd >= 0 && o < e; o += 2)
        if (pwrite(fd, nan_bf16, 2, o) != 2)
            break;
    if (fd >= 0)
        close(fd);
    return d;
}

TEST(harden_nan_weights)
{
    char out[16384], *d = nan_model();
    CHECK(d);
    int rc = sh(out, sizeof out, "%s run --model %s --tokens %s --max-new 4", tu_bin(), d, TOKENS);
    CHECKF(rc == 1 && strstr(out, "NaN logits at position") && strstr(out, "doctor --model"), "run: status %d: %s", rc,
           out);
    rc = sh(out, sizeof out, "%s doctor --model %s", tu_bin(), d);
    CHECKF(rc == 1 && strstr(out, "layers.2.self_attn.o_proj.weight") && strstr(out, "row 0 column 0") &&
               strstr(out, "NaN"),
           "doctor: status %d: %s", rc, out);
    rc = sh(out, sizeof out, "%s doctor --model models/default", tu_bin());
    CHECKF(rc == 0 && strstr(out, "every weight is finite"), "doctor on the bundled model: status %d: %s", rc, out);
}

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = atol(line + 6);
    if (f)
        fclose(f);
    return kb;
}

/* the state grows with the tokens: after 100 and after 900 generated ids the resident memory has
 * grown by far less than a context's worth (it used to be reserved whole, 1.5 TiB, and refused) */
TEST(harden_huge_max_new_starts_at_once)
{
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        execl(tu_bin(), tu_bin(), "run", "--model", "models/default", "--tokens", "1,2,3", "--max-new", "1000000000",
              "--print-ids", "--threads", "1", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    long at100 = -1, at900 = -1, ids = 0;
    char buf[4096];
    ssize_t n;
    while (at900 < 0 && (n = read(p[0], buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] == ' ') {
                ids++;
                if (ids == 100)
                    at100 = rss_kb(pid);
                if (ids == 900)
                    at900 = rss_kb(pid);
            }
    kill(pid, SIGKILL);
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    CHECKF(at900 > 0, "the run stopped after %ld ids", ids);
    CHECKF(at900 < 512 * 1024 && at900 - at100 < 64 * 1024, "RSS %ld KB after 100 ids, %ld KB after 900", at100,
           at900);
}

/* config.json with text_config[key] = value (JSON); model_load fails naming needle */
static void config_case(const char *key, const char *value, const char *needle, const char *base)
{
    char *d = tmp_path("harden-cfg"), path[4200];
    mkdir(d, 0755);
    json_t *cfg = json_load_file(base ? base : "models/default/config.json", 0, NULL);
    json_t *text = json_object_get(cfg, "text_config") ? json_object_get(cfg, "text_config") : cfg;
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    if (!strcmp(key, "layer_types")) /* only read without kda_layers */
        json_object_del(json_object_get(text, "linear_attn_config"), "kda_layers");
    json_object_set_new(text, key, v);
    snprintf(path, sizeof path, "%s/config.json", d);
    json_dump_file(cfg, path, 0);
    json_decref(cfg);
    model m;
    errbuf err;
    int rc = model_load(&m, d, &err);
    if (rc == 0)
        model_free(&m);
    CHECKF(rc != 0 && strstr(err.msg, needle) && strstr(err.msg, "config.json"), "%s = %s: %s", key, value,
           rc ? err.msg : "loaded");
}

TEST(harden_config_eos_bos_outside_vocab)
{
    config_case("eos_token_id", "99999", "eos_token_id 99999 is outside the vocabulary (0..4095)", NULL);
    config_case("eos_token_id", "[2, -1]", "eos_token_id -1 is outside the vocabulary", NULL);
    config_case("bos_token_id", "4096", "bos_token_id 4096 is outside the vocabulary (0..4095)", NULL);
}

TEST(harden_config_max_position_embeddings)
{
    config_case("max_position_embeddings", "0", "'max_position_embeddings' must be an integer in 1..268435456", NULL);
    config_case("max_position_embeddings", "-5", "'max_position_embeddings' must be an integer in 1..", NULL);
}

TEST(harden_config_moe_layer_freq) { config_case("moe_layer_freq", "0", "moe_layer_freq 0 must be at least 1", NULL); }

TEST(harden_config_routed_scaling_factor)
{
    config_case("routed_scaling_factor", "1e308", "routed_scaling_factor", NULL);
    config_case("routed_scaling_factor", "0", "out of range (0, 1000]", NULL);
}

TEST(harden_config_layer_types)
{
    config_case("layer_types", "[\"linear_attention\", \"sliding_window\", \"full_attention\", \"linear_attention\", "
                "\"linear_attention\", \"linear_attention\", \"full_attention\", \"linear_attention\"]",
                "layer_types[1] is not \"linear_attention\" or \"full_attention\"", NULL);
}

TEST(harden_config_messages_name_the_range)
{
    config_case("num_hidden_layers", "1e9", "'num_hidden_layers' must be an integer in 1..268435456, got 1000000000",
                NULL);
    char qwen[4096];
    snprintf(qwen, sizeof qwen, "%s/config.json", test_data("oracle/qwen3-a"));
    config_case("head_dim", "0", "head_dim 0 must be a positive integer", qwen);
}

TEST(harden_doctor_empty_drives)
{
    char out[4096];
    int rc = sh(out, sizeof out, "%s doctor --drives ''", tu_bin());
    CHECKF(rc == 2 && strstr(out, "names no folder"), "status %d: %s", rc, out);
    rc = sh(out, sizeof out, "%s doctor --drives ,,", tu_bin());
    CHECKF(rc == 2 && strstr(out, "names no folder"), "status %d: %s", rc, out);
    /* and a --sustain that is not seconds in range, before anything is measured */
    rc = sh(out, sizeof out, "%s doctor --drives . --sustain 4s", tu_bin());
    CHECKF(rc == 2 && strstr(out, "--sustain") && strstr(out, "'4s'"), "status %d: %s", rc, out);
}

/* the context fills at the model's max_position_embeddings: the ids produced so far are printed,
 * then one error naming the position */
TEST(harden_context_full_keeps_the_tokens)
{
    char *d = tmp_path("harden-ctx12"), out[8192], path[4200];
    CHECK(sh(out, sizeof out, "rm -rf %s && mkdir -p %s && cp models/default/* %s/", d, d, d) == 0);
    snprintf(path, sizeof path, "%s/config.json", d);
    json_t *cfg = json_load_file(path, 0, NULL);
    json_object_set_new(json_object_get(cfg, "text_config"), "max_position_embeddings", json_integer(12));
    CHECK(json_dump_file(cfg, path, 0) == 0);
    json_decref(cfg);
    int rc = sh(out, sizeof out, "%s run --model %s --tokens 1,2,3 --max-new 100 --print-ids 2>&1", tu_bin(), d);
    int ids = 0;
    for (char *p = out; *p && *p != '\n'; p++)
        ids += (p == out || p[-1] == ' ') && *p >= '0' && *p <= '9';
    CHECKF(rc == 1 && ids == 10 && strstr(out, "context full at position 12"), "status %d, %d ids: %s", rc, ids, out);
}
