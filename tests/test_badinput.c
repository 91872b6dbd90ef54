/* test_badinput.c — bad checkpoints and configs give one clear error naming the file and the
 * tensor or field, never a crash or silent garbage: truncated file, header length past the end,
 * offsets out of range or overlapping, byte-length mismatch, wrong shape, missing tensor,
 * missing or malformed config, unknown dtype. Checked through model_load and through the CLI
 * (non-zero exit, one line on stderr). Mutations start from the bundled K3-format model. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "model/model.h"
#include "test.h"
#include "test_util.h"


/* the base checkpoint split into header JSON and data */
typedef struct ckpt {
    json_t *hdr;
    const uint8_t *data;
    size_t data_len;
    file_map map;
} ckpt;

static int ckpt_open(ckpt *c)
{
    errbuf err;
    if (file_map_open(&c->map, "models/default/model.safetensors", &err) != 0)
        return -1;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | c->map.data[i];
    c->hdr = json_loadb((const char *)c->map.data + 8, n, 0, NULL);
    c->data = c->map.data + 8 + n;
    c->data_len = c->map.size - 8 - n;
    return c->hdr ? 0 : -1;
}

static void ckpt_close(ckpt *c)
{
    json_decref(c->hdr);
    file_map_close(&c->map);
}

/* Writes dir/model.safetensors from header h and data (len bytes; truncated if cut > 0), and
 * copies the base config.json unless config_text is given. */
static void write_model(const char *dir, json_t *h, const uint8_t *data, size_t len, uint64_t hlen_override,
                        const char *config_text)
{
    mkdir(dir, 0755);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char *txt = json_dumps(h, JSON_COMPACT);
    uint64_t hl = strlen(txt);
    FILE *f = fopen(path, "wb");
    uint64_t hw = hlen_override ? hlen_override : hl;
    for (int i = 0; i < 8; i++)
        fputc((int)((hw >> (8 * i)) & 0xFF), f);
    fwrite(txt, 1, hl, f);
    fwrite(data, 1, len, f);
    fclose(f);
    free(txt);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (config_text) {
        f = fopen(path, "w");
        fputs(config_text, f);
        fclose(f);
    } else {
        char *cfg;
        size_t n;
        errbuf err;
        if (file_read_all("models/default/config.json", &cfg, &n, &err) == 0) {
            f = fopen(path, "w");
            fwrite(cfg, 1, n, f);
            fclose(f);
            free(cfg);
        }
    }
}

/* model_load must fail with a message containing every needle; the CLI must exit non-zero
 * with exactly one line on stderr. */
static void expect_error(const char *dir, const char *const *needles)
{
    model m;
    errbuf err;
    int rc = model_load(&m, dir, &err);
    if (rc == 0) {
        model_free(&m);
        test_fail(__FILE__, __LINE__, "%s: loaded without error", dir);
        return;
    }
    for (int i = 0; needles[i]; i++)
        CHECKF(strstr(err.msg, needles[i]), "%s: error '%s' does not mention '%s'", dir, err.msg, needles[i]);
    CHECKF(!strchr(err.msg, '\n'), "error is not one line: %s", err.msg);
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd, "%s eval --model %s --tokens 1,2 --logits-out %s/unused.f32", tu_bin(), dir,
             test_tmpdir());
    int st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 1, "%s: CLI exit status %d, output: %s", dir, st, out);
    int lines = 0;
    for (char *p = out; *p; p++)
        lines += *p == '\n';
    CHECKF(lines == 1 && strncmp(out, "deltafin eval: ", 15) == 0, "%s: CLI output is not one error line: %s", dir,
           out);
}

static json_t *entry(ckpt *c, const char *name) { return json_object_get(c->hdr, name); }

static char *dirname_for(const char *what)
{
    static char d[4096];
    snprintf(d, sizeof d, "%s/%s", test_tmpdir(), what);
    return d;
}

TEST(bad_truncated_file)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    char *d = dirname_for("truncated");
    write_model(d, c.hdr, c.data, c.data_len / 2, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "past the end", NULL});
    ckpt_close(&c);
}

TEST(bad_header_length_past_end)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    char *d = dirname_for("hdrlen");
    write_model(d, c.hdr, c.data, 100, 1ull << 40, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "header length", "past the end", NULL});
    ckpt_close(&c);
}

TEST(bad_offsets_out_of_range)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    json_t *e = entry(&c, "language_model.model.norm.weight");
    json_t *off = json_object_get(e, "data_offsets");
    json_int_t b = json_integer_value(json_array_get(off, 0));
    json_array_set_new(off, 0, json_integer(b + (json_int_t)c.data_len));
    json_array_set_new(off, 1, json_integer(b + (json_int_t)c.data_len + 256));
    char *d = dirname_for("offsets");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "language_model.model.norm.weight", "past the end", NULL});
    ckpt_close(&c);
}

TEST(bad_offsets_overlap)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    /* point the final norm at the bytes of another [H] BF16 tensor */
    json_t *a = entry(&c, "language_model.model.norm.weight");
    json_t *b = entry(&c, "language_model.model.output_attn_res_norm.weight");
    json_object_set(a, "data_offsets", json_object_get(b, "data_offsets"));
    char *d = dirname_for("overlap");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "overlap", NULL});
    ckpt_close(&c);
}

/* an empty tensor between two overlapping ones used to hide the overlap (only neighbours in
 * offset order were compared): the final norm moved inside a large matrix, an empty tensor just
 * before it */
TEST(bad_offsets_overlap_hidden_by_an_empty_tensor)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    json_t *big = entry(&c, "language_model.model.layers.0.mlp.down_proj.weight");
    json_t *norm = entry(&c, "language_model.model.norm.weight");
    json_int_t a0 = json_integer_value(json_array_get(json_object_get(big, "data_offsets"), 0));
    json_int_t len = json_integer_value(json_array_get(json_object_get(norm, "data_offsets"), 1)) -
                     json_integer_value(json_array_get(json_object_get(norm, "data_offsets"), 0));
    json_object_set_new(norm, "data_offsets", json_pack("[I, I]", a0 + 1024, a0 + 1024 + len));
    json_object_set_new(c.hdr, "extra.empty",
                        json_pack("{s:s, s:[i], s:[I, I]}", "dtype", "BF16", "shape", 0, "data_offsets", a0 + 512,
                                  a0 + 512));
    char *d = dirname_for("overlap-hidden");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "overlap", "down_proj", "norm.weight", NULL});
    ckpt_close(&c);
}

TEST(bad_byte_length_mismatch)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    json_t *e = entry(&c, "language_model.model.norm.weight");
    json_array_set_new(json_object_get(e, "shape"), 0, json_integer(129)); /* 129 BF16 in 256 bytes */
    char *d = dirname_for("bytelen");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "language_model.model.norm.weight", "bytes", NULL});
    ckpt_close(&c);
}

TEST(bad_wrong_shape)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    const char *name = "language_model.model.layers.0.mlp.down_proj.weight";
    json_t *shape = json_object_get(entry(&c, name), "shape");
    json_t *r = json_incref(json_array_get(shape, 0)), *k = json_incref(json_array_get(shape, 1));
    json_array_set_new(shape, 0, k); /* transposed: same byte length, wrong shape */
    json_array_set_new(shape, 1, r);
    char *d = dirname_for("shape");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", name, "expected", NULL});
    ckpt_close(&c);
}

TEST(bad_missing_tensor)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    const char *name = "language_model.model.layers.3.self_attn.kv_b_proj.weight";
    json_t *e = json_incref(entry(&c, name));
    json_object_del(c.hdr, name);
    json_object_set_new(c.hdr, "language_model.model.layers.3.self_attn.kv_b_proj.renamed", e);
    char *d = dirname_for("missing");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"missing tensor", name, NULL});
    ckpt_close(&c);
}

TEST(bad_unknown_dtype)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    json_object_set_new(entry(&c, "language_model.model.norm.weight"), "dtype", json_string("BF17"));
    char *d = dirname_for("dtype");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "unknown dtype 'BF17'", NULL});
    ckpt_close(&c);
}

TEST(bad_missing_config_field)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    json_t *cfg = json_load_file("models/default/config.json", 0, NULL);
    CHECK(cfg);
    json_object_del(json_object_get(cfg, "text_config"), "kv_lora_rank");
    char *txt = json_dumps(cfg, JSON_INDENT(1));
    char *d = dirname_for("cfgfield");
    write_model(d, c.hdr, c.data, c.data_len, 0, txt);
    expect_error(d, (const char *const[]){"config.json", "kv_lora_rank", NULL});
    free(txt);
    json_decref(cfg);
    ckpt_close(&c);
}

TEST(bad_malformed_config)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    char *d = dirname_for("cfgjson");
    write_model(d, c.hdr, c.data, c.data_len, 0, "{\n  \"model_type\": \"kimi_k3\",\n  \"text_config\": {,}\n}\n");
    expect_error(d, (const char *const[]){"config.json:3:", NULL});
    ckpt_close(&c);
}

TEST(bad_unsupported_model_type)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    char *d = dirname_for("cfgtype");
    write_model(d, c.hdr, c.data, c.data_len, 0, "{\"model_type\": \"llama\"}");
    expect_error(d, (const char *const[]){"config.json", "model_type 'llama'", NULL});
    ckpt_close(&c);
}

TEST(bad_not_a_folder)
{
    expect_error("/nonexistent/model", (const char *const[]){"/nonexistent/model", NULL});
}

TEST(bad_token_ids_cli)
{
    char cmd[4096], out[4096];
    snprintf(cmd, sizeof cmd, "%s run --tokens 1,99999999 --max-new 2", tu_bin());
    CHECKF(tu_run(cmd, out, sizeof out) == 1 && strstr(out, "outside the vocabulary"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s run --tokens 1,x", tu_bin());
    CHECKF(tu_run(cmd, out, sizeof out) == 1 && strstr(out, "not a token id"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s run --tokens 1 --temperature -1", tu_bin());
    CHECKF(tu_run(cmd, out, sizeof out) == 2 && strstr(out, "--temperature"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s frobnicate", tu_bin());
    CHECKF(tu_run(cmd, out, sizeof out) == 2 && strstr(out, "unknown command"), "%s", out);
}

/* an I8 matrix (what prepare --spine int8 writes) needs its BF16 group scales, of the right shape */
TEST(bad_int8_scales)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    const char *name = "language_model.model.layers.0.mlp.down_proj.weight"; /* BF16 [192, 512] */
    json_t *e = entry(&c, name), *off = json_object_get(e, "data_offsets");
    json_int_t b = json_integer_value(json_array_get(off, 0));
    json_object_set_new(e, "dtype", json_string("I8"));
    json_array_set_new(off, 1, json_integer(b + 192 * 512)); /* the first half of its bytes */
    char *d = dirname_for("int8-noscale");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", name, "weight_scale", NULL});
    /* scales in the second half, F32 instead of BF16 */
    json_t *s = json_pack("{s:s, s:[i, i], s:[I, I]}", "dtype", "F32", "shape", 192, 16, "data_offsets",
                          (json_int_t)(b + 192 * 512), (json_int_t)(b + 192 * 512 + 192 * 16 * 4));
    json_object_set_new(c.hdr, "language_model.model.layers.0.mlp.down_proj.weight_scale", s);
    d = dirname_for("int8-f32scale");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "down_proj.weight_scale", "expected BF16", NULL});
    /* BF16 scales, but a zero point beside them: asymmetric INT8 is not this format */
    json_object_set_new(s, "dtype", json_string("BF16"));
    json_array_set_new(json_object_get(s, "data_offsets"), 1, json_integer(b + 192 * 512 + 192 * 16 * 2));
    json_t *zp = json_pack("{s:s, s:[i, i], s:[I, I]}", "dtype", "I8", "shape", 192, 16, "data_offsets",
                           (json_int_t)(b + 192 * 512 + 192 * 16 * 2), (json_int_t)(b + 192 * 512 + 192 * 16 * 3));
    json_object_set_new(c.hdr, "language_model.model.layers.0.mlp.down_proj.weight_zero_point", zp);
    d = dirname_for("int8-zeropoint");
    write_model(d, c.hdr, c.data, c.data_len, 0, NULL);
    expect_error(d, (const char *const[]){"model.safetensors", "weight_zero_point", "symmetric", NULL});
    ckpt_close(&c);
}

/* prepare --spine int8 refuses a non-finite weight in a matrix it would code, naming it, before it
 * writes anything (found while writing, it would leave a store that fails there on every rerun) */
TEST(bad_int8_nonfinite_weight)
{
    ckpt c;
    CHECK(ckpt_open(&c) == 0);
    const char *name = "language_model.model.layers.0.mlp.up_proj.weight"; /* BF16 [512, 192] */
    json_t *off = json_object_get(entry(&c, name), "data_offsets");
    CHECK(off);
    size_t at = (size_t)json_integer_value(json_array_get(off, 0)) + 2 * (7 * 192 + 40);
    uint8_t *data = malloc(c.data_len);
    CHECK(data);
    memcpy(data, c.data, c.data_len);
    data[at] = 0xC0; /* BF16 0x7FC0: NaN at row 7, column 40 */
    data[at + 1] = 0x7F;
    char *d = dirname_for("int8-nan"), out_dir[4200], cmd[9000], out[4096];
    write_model(d, c.hdr, data, c.data_len, 0, NULL);
    free(data);
    ckpt_close(&c);
    snprintf(out_dir, sizeof out_dir, "%s-store", d);
    snprintf(cmd, sizeof cmd, "%s prepare --model %s --out %s --spine int8", tu_bin(), d, out_dir);
    int st = tu_run(cmd, out, sizeof out);
    CHECKF(st == 1 && strstr(out, name) && strstr(out, "row 7 column 40") && strstr(out, "not finite"), "status %d: %s",
           st, out);
    struct stat sb;
    CHECKF(stat(out_dir, &sb) != 0, "%s was created", out_dir);
}
