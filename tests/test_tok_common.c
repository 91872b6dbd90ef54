/* test_tok_common.c — see test_tok.h. Loaded tokenizers live until the process exits (they are
 * reachable from the cache, so the leak checker does not count them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
