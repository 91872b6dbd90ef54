/* test_tok_common.c — see test_tok.h. Loaded tokenizers live until the process exits (they are
 * reachable from the cache, so the leak checker does not count them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "test.h"
#include "test_tok.h"
#include "tokenizer/tok_unicode.h"

enum { CACHE = 16 };
static struct {
    char name[64];
    tok *t;
    json_t *j;
    char why[800];
} cache[CACHE];

tok *tt_tok(const char *name, const char **why)
{
    int i;
    for (i = 0; i < CACHE && cache[i].name[0]; i++)
        if (!strcmp(cache[i].name, name) && !cache[i].j)
            break;
    if (i == CACHE)
        return NULL;
    if (!cache[i].name[0]) {
        char rel[256];
        errbuf err;
        snprintf(cache[i].name, sizeof cache[i].name, "%s", name);
        snprintf(rel, sizeof rel, "tokenizers/%s", name);
        if (tok_load(&cache[i].t, test_data(rel), &err))
            snprintf(cache[i].why, sizeof cache[i].why, "%s", err.msg);
    }
    if (why)
        *why = cache[i].why;
    return cache[i].t;
}

const json_t *tt_json(const char *rel)
{
    int i;
    for (i = 0; i < CACHE && cache[i].name[0]; i++)
        if (!strcmp(cache[i].name, rel) && cache[i].j)
            return cache[i].j;
    if (i == CACHE)
        return NULL;
    char path[256];
    json_error_t je;
    snprintf(path, sizeof path, "tokenizers/%s", rel);
    json_t *j = json_load_file(test_data(path), JSON_ALLOW_NUL, &je);
    if (!j)
        return NULL;
    snprintf(cache[i].name, sizeof cache[i].name, "%s", rel);
    cache[i].j = j;
    return j;
}

int tt_ids_eq(const tok_ids *got, const json_t *want, char *why, size_t cap)
{
    size_t n = json_array_size(want);
    for (size_t i = 0; i < n || i < got->n; i++) {
        long long w = i < n ? json_integer_value(json_array_get(want, i)) : -1;
        long long g = i < got->n ? got->v[i] : -1;
        if (w != g) {
            snprintf(why, cap, "first difference at id %zu: got %lld, want %lld (lengths %zu, %zu)", i, g, w, got->n,
                     n);
            return 0;
        }
    }
    return 1;
}

void tt_fnv(const int32_t *v, size_t n, char out[17])
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= ((uint32_t)v[i] >> (8 * k)) & 0xff;
            h *= 0x100000001b3ull;
        }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

uint64_t tt_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

size_t tt_rand_utf8(uint64_t *st, char *buf, size_t maxcp)
{
    static const uint32_t ranges[][2] = {
        {0x20, 0x7E},       {0x20, 0x7E},     {0x61, 0x7A},       {0x41, 0x5A},     {0x30, 0x39},
        {0x09, 0x0D},       {0xA0, 0xFF},     {0x100, 0x17F},     {0x300, 0x36F},   {0x391, 0x3C9},
        {0x410, 0x44F},     {0x5D0, 0x5EA},   {0x621, 0x64A},     {0x660, 0x669},   {0x905, 0x94D},
        {0xE01, 0xE3A},     {0x1100, 0x1112}, {0x1161, 0x1175},   {0x1E00, 0x1EFF}, {0x2000, 0x206F},
        {0x3000, 0x303F},   {0x3041, 0x30FF}, {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3}, {0xFF01, 0xFF5E},
        {0x1F300, 0x1F64F}, {0x20000, 0x2A6DF}, {0x1F3FB, 0x1F3FF}, {0x200B, 0x200D}, {0x27, 0x27},
    };
    size_t n = 1 + tt_rand(st) % maxcp, o = 0;
    size_t nr = sizeof ranges / sizeof ranges[0];
    uint32_t lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || tt_rand(st) % 4 == 0) { /* stay in one script for a while */
            size_t r = tt_rand(st) % nr;
            lo = ranges[r][0];
            hi = ranges[r][1];
        }
        uint32_t c = lo + (uint32_t)(tt_rand(st) % (hi - lo + 1));
        if (c >= 0xD800 && c <= 0xDFFF)
            c = 'x';
        o += (size_t)toku_put((uint8_t *)buf + o, c);
    }
    buf[o] = 0;
    return o;
}

/* A K2-style folder: the stand-in ranks (symlinked) and K2's special names at the same offsets. */
tok *tt_k2_tok(int thinking, errbuf *err)
{
    char dir[512], path[700], target[700], cmd[1600];
    snprintf(dir, sizeof dir, "%s/k2-%d", test_tmpdir(), thinking);
    snprintf(target, sizeof target, "%s", test_data("tokenizers/kimi-k3-standin/tiktoken.model"));
    if (target[0] != '/') {
        char cwd[400];
        if (!getcwd(cwd, sizeof cwd))
            return NULL;
        snprintf(target, sizeof target, "%s/%s", cwd, test_data("tokenizers/kimi-k3-standin/tiktoken.model"));
    }
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ln -sf '%s' '%s/tiktoken.model'", dir, target, dir);
    if (system(cmd) != 0)
        return NULL;
    static const char *names[][2] = {
        {"199998", "[BOS]"}, {"199999", "[EOS]"}, {"200000", "<|im_end|>"}, {"200001", "<|im_user|>"},
        {"200002", "<|im_assistant|>"}, {"200008", "<|im_system|>"}, {"200009", "<|tool_calls_section_begin|>"},
        {"200010", "<|tool_calls_section_end|>"}, {"200011", "<|tool_call_begin|>"},
        {"200012", "<|tool_call_argument_begin|>"}, {"200013", "<|tool_call_end|>"}, {"200015", "<|im_middle|>"},
        {"200020", "<think>"}, {"200021", "</think>"}};
    char cfg[4096];
    size_t o = (size_t)snprintf(cfg, sizeof cfg, "{\"chat_template\": \"{{ '<|im_middle|>' }}%s\", \"added_tokens_decoder\": {",
                                thinking ? "<think>" : "");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        o += (size_t)snprintf(cfg + o, sizeof cfg - o, "%s\"%s\": {\"content\": \"%s\", \"special\": true}", i ? ", " : "",
                              names[i][0], names[i][1]);
    snprintf(cfg + o, sizeof cfg - o, "}}");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (file_write_atomic(path, cfg, strlen(cfg), err))
        return NULL;
    tok *t;
    return tok_load(&t, dir, err) ? NULL : t;
}


/* A DeepSeek-style tokenizer.json in a temp folder: byte-level vocab of the 256 bytes and
 * DeepSeek's specials at 300.. */
tok *tt_ds_tok(errbuf *err)
{
    char dir[512], path[700], cmd[600];
    snprintf(dir, sizeof dir, "%s/dsv3", test_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) {
        errbuf_set(err, "mkdir %s failed", dir);
        return NULL;
    }
    char *j = malloc(64 * 1024), *p = j;
    p += sprintf(p, "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                    "\"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
                    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}, "
                    "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {");
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + n++;
        p += sprintf(p, "%s\"\\u%04x\": %d", b ? ", " : "", cp, b);
    }
    p += sprintf(p, "}, \"merges\": []}, \"added_tokens\": [");
    static const char *sp[] = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                               "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                               "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                               "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"};
    for (int i = 0; i < 13; i++)
        p += sprintf(p, "%s{\"id\": %d, \"content\": \"%s\", \"special\": true}", i ? ", " : "", 300 + i, sp[i]);
    sprintf(p, "]}");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int bad = file_write_atomic(path, j, strlen(j), err);
    free(j);
    if (bad)
        return NULL;
    static const char cfg[] = "{\"chat_template\": \"{{'<｜Assistant｜>'}}\"}";
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (file_write_atomic(path, cfg, strlen(cfg), err))
        return NULL;
    tok *t;
    return tok_load(&t, dir, err) ? NULL : t;
}
