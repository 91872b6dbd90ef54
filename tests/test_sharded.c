/* test_sharded.c — a checkpoint split into shards with model.safetensors.index.json loads and
 * gives the same logits bit for bit as the single file; a broken index is a clear error. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/st_write.h"
#include "test.h"
#include "test_util.h"

struct copy_ctx {
    const st_set *src;
    const st_tensor **t;
};

static int fill(void *ud, int idx, uint8_t *buf, uint64_t n, errbuf *err)
{
    struct copy_ctx *c = ud;
    memcpy(buf, c->t[idx]->data, n);
    return 0;
}

/* Splits src_dir's model into `shards` files under dst (tensor i goes to shard i % shards);
 * drop names one tensor to leave out of its shard while the index still lists it. */
static int shard(const char *src_dir, const char *dst, int shards, const char *drop)
{
    errbuf err;
    st_set s;
    if (st_open_dir(&s, src_dir, &err) != 0)
        return -1;
    mkdir(dst, 0755);
    json_t *wm = json_object();
    for (int k = 0; k < shards; k++) {
        st_wtensor *wt = calloc((size_t)s.n, sizeof *wt);
        const st_tensor **src = calloc((size_t)s.n, sizeof *src);
        int n = 0;
        char fname[64], path[4096];
        snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", k + 1, shards);
        for (int i = k; i < s.n; i += shards) {
            json_object_set_new(wm, s.t[i].name, json_string(fname));
            if (drop && strcmp(s.t[i].name, drop) == 0)
                continue;
            snprintf(wt[n].name, sizeof wt[n].name, "%s", s.t[i].name);
            wt[n].dtype = s.t[i].dtype;
            wt[n].ndim = s.t[i].ndim;
            memcpy(wt[n].shape, s.t[i].shape, sizeof wt[n].shape);
            src[n++] = &s.t[i];
        }
        struct copy_ctx c = {&s, src};
        snprintf(path, sizeof path, "%s/%s", dst, fname);
        int rc = st_write_file(path, wt, n, fill, &c, &err);
        free(wt);
        free(src);
        if (rc != 0) {
            st_close(&s);
            json_decref(wm);
            return -1;
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dst);
    json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", wm);
    json_dump_file(idx, path, JSON_INDENT(1));
    json_decref(idx);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/", src_dir, dst);
    st_close(&s);
    return system(cmd) == 0 ? 0 : -1;
}

TEST(sharded_same_logits)
{
    char dst[4096];
    snprintf(dst, sizeof dst, "%s/sharded", test_tmpdir());
    CHECK(shard("models/default", dst, 3, NULL) == 0);
    errbuf err;
    model a, b;
    CHECKF(model_load(&a, "models/default", &err) == 0, "%s", err.msg);
    CHECKF(model_load(&b, dst, &err) == 0, "%s", err.msg);
    CHECK(b.st.nfiles == 3);
    int32_t ids[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
    float *la = tu_eval(&a, ids, 12, 12, 2, NULL, &err), *lb = tu_eval(&b, ids, 12, 12, 2, NULL, &err);
    CHECK(la && lb);
    CHECK(memcmp(la, lb, sizeof(float) * 12 * (size_t)a.hp.vocab) == 0);
    free(la);
    free(lb);
    model_free(&a);
    model_free(&b);
}

TEST(sharded_index_names_missing_tensor)
{
    char dst[4096];
    snprintf(dst, sizeof dst, "%s/sharded_bad", test_tmpdir());
    const char *drop = "language_model.model.norm.weight";
    CHECK(shard("models/default", dst, 2, drop) == 0);
    errbuf err;
    model m;
    CHECK(model_load(&m, dst, &err) != 0);
    CHECKF(strstr(err.msg, "model.safetensors.index.json") && strstr(err.msg, drop), "%s", err.msg);
}

TEST(synth_k3_tiny_loads_and_runs)
{
    /* models/default is a trained mini-K3 now (tools/train), no longer synth output; synth's k3-tiny
     * preset stays a random model of K3's layout: it regenerates byte for byte, loads and runs */
    char cmd[8192], out[4096];
    const char *t = test_tmpdir();
    snprintf(cmd, sizeof cmd,
             "%s synth --preset k3-tiny --out %s/a >/dev/null && %s synth --preset k3-tiny --out %s/b >/dev/null && "
             "cmp %s/a/model.safetensors %s/b/model.safetensors && cmp %s/a/config.json %s/b/config.json && "
             "%s run --model %s/a --tokens 1,2,3 --max-new 4 --print-ids",
             tu_bin(), t, tu_bin(), t, t, t, t, t, tu_bin(), t);
    int st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 0, "synth k3-tiny twice + run: status %d: %s", st, out);
    int n = 0;
    for (char *p = out; *p;) {
        char *end;
        strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        n++;
        p = end;
    }
    CHECKF(n == 4, "run on the synth model printed %d ids, not 4: %s", n, out);
}
