/* bench_tok.c — tokenizer throughput: encode MB/s on English prose, C source and CJK text, on 1 and
 * 2 threads (and more with --threads), and decode MB/s (whole and streaming).
 *
 *   build/bench/bench_tok [--model DIR] [--mb N] [--reps N] [--threads N] [--dump DIR | --texts DIR]
 * The default model is the Kimi K3 stand-in vocabulary as tests/testdata.sh unpacks it (make test does).
 *
 * Texts (all from this machine, none downloaded):
 *   prose  every file of /usr/share/common-licenses, concatenated and repeated to N MB
 *   code   the C headers directly under /usr/include (sorted by name), concatenated to N MB
 *   cjk    sentences of CJK tokens (Han, kana, Hangul) drawn from the model's own vocabulary with a
 *          fixed-seed generator, with ，。、 punctuation and a newline every few sentences
 * --dump DIR writes the three texts, so other tokenizers (tiktoken) can be timed on the same bytes;
 * --texts DIR reads them back (prose.txt, code.txt, cjk.txt) on a machine that lacks the sources.
 * Every figure is the best of --reps runs. Parallel output is checked against serial.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/pool.h"
#include "base/timer.h"
#include "tokenizer/tok.h"
#include "tokenizer/tok_unicode.h"

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void add(buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static int cmpstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Concatenates the regular files of dir whose name ends with suffix ("" = all), sorted. */
static void read_dir(buf *b, const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (e->d_name[0] == '.' || l < sl || strcmp(e->d_name + l - sl, suffix))
            continue;
        names = realloc(names, (n + 1) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    if (d)
        closedir(d);
    qsort(names, n, sizeof *names, cmpstr);
    for (size_t i = 0; i < n; i++) {
        char path[4096], *txt;
        size_t len;
        errbuf err;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (file_is_dir(path) == 0 && file_read_all(path, &txt, &len, &err) == 0) {
            add(b, txt, len);
            free(txt);
        }
        free(names[i]);
    }
    free(names);
}

static void grow_to(buf *b, size_t target)
{
    size_t base = b->n;
    if (!base)
        return;
    while (b->n < target)
        add(b, b->p, base < target - b->n ? base : target - b->n);
    /* do not end inside a UTF-8 sequence */
    while (b->n && (b->p[b->n - 1] & 0xC0) == 0x80)
        b->n--;
    if (b->n && (unsigned char)b->p[b->n - 1] >= 0xC0)
        b->n--;
    b->p[b->n] = 0;
}

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int is_cjk(uint32_t c)
{
    return (toku_flags(c) & TOKU_HAN) || (c >= 0x3041 && c <= 0x30FF) || (c >= 0xAC00 && c <= 0xD7A3);
}

static void make_cjk(buf *b, const tok *t, size_t target)
{
    int32_t *pick = NULL;
    size_t np = 0;
    for (int32_t id = 0; id < tok_vocab_size(t); id++) {
        size_t len;
        const uint8_t *p = tok_token_bytes(t, id, &len);
        if (!p || tok_is_special(t, id) || len < 3)
            continue;
        const uint8_t *q = p, *e = p + len;
        int ok = 1;
        while (q < e && ok) {
            int l;
            uint32_t c = toku_next(q, e, &l);
            ok = c != TOKU_INVALID && is_cjk(c);
            q += l;
        }
        if (ok) {
            pick = realloc(pick, (np + 1) * sizeof *pick);
            pick[np++] = id;
        }
    }
    if (!np)
        return;
    uint64_t s = 42;
    static const char *punct[] = {"，", "。", "、", "。\n"};
    while (b->n < target) {
        int words = 3 + (int)(next(&s) % 12);
        for (int w = 0; w < words; w++) {
            size_t len;
            const uint8_t *p = tok_token_bytes(t, pick[next(&s) % np], &len);
            add(b, (const char *)p, len);
        }
        const char *pu = punct[next(&s) % 4];
        add(b, pu, strlen(pu));
    }
    free(pick);
}

static double best_encode(const tok *t, const buf *b, pool *p, int reps, tok_ids *out)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        errbuf err;
        out->n = 0;
        double t0 = timer_now();
        int rc = p ? tok_encode_parallel(t, b->p, b->n, TOK_SPECIAL_NONE, p, out, &err)
                   : tok_encode(t, b->p, b->n, TOK_SPECIAL_NONE, out, &err);
        double dt = timer_now() - t0;
        if (rc) {
            fprintf(stderr, "encode: %s\n", err.msg);
            exit(1);
        }
        if (dt < best)
            best = dt;
    }
    return best;
}

int main(int argc, char **argv)
{
    const char *model = "build/testdata/tokenizers/kimi-k3-standin", *dump = NULL, *texts_dir = NULL;
    long mb = 4, reps = 5, maxth = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            maxth = atol(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
            dump = argv[++i];
        else if (!strcmp(argv[i], "--texts") && i + 1 < argc)
            texts_dir = argv[++i];
        else {
            fprintf(stderr, "usage: bench_tok [--model DIR] [--mb N] [--reps N] [--threads N] [--dump DIR | --texts DIR]\n");
            return 2;
        }
    }
    if (mb < 1 || reps < 1 || maxth < 1)
        return 2;
    errbuf err;
    tok *t;
    double t0 = timer_now();
    if (tok_load(&t, model, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("model %s: %d ids, loaded in %.3f s; %d CPUs\n", model, tok_vocab_size(t), timer_now() - t0, pool_ncpu());
    buf texts[3] = {{0}};
    const char *names[3] = {"prose", "code", "cjk"};
    size_t target = (size_t)mb << 20;
    if (texts_dir) {
        for (int k = 0; k < 3; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.txt", texts_dir, names[k]);
            if (file_read_all(path, &texts[k].p, &texts[k].n, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            texts[k].cap = texts[k].n + 1;
        }
    } else {
        read_dir(&texts[0], "/usr/share/common-licenses", "");
        read_dir(&texts[1], "/usr/include", ".h");
        make_cjk(&texts[2], t, target);
    }
    for (int k = 0; k < 3; k++) {
        if (!texts_dir)
            grow_to(&texts[k], target);
        if (!texts[k].n) {
            fprintf(stderr, "no %s text on this machine\n", names[k]);
            return 1;
        }
        if (dump) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.txt", dump, names[k]);
            if (file_write_atomic(path, texts[k].p, texts[k].n, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        }
    }
    printf("%-6s %9s %9s %10s", "text", "MB", "ids", "1 thread");
    for (long th = 2; th <= maxth; th *= 2)
        printf(" %8ld thr %8s", th, "speedup");
    printf(" %11s %11s\n", "decode", "stream");
    for (int k = 0; k < 3; k++) {
        tok_ids serial = {0}, par = {0};
        double mbytes = (double)texts[k].n / 1e6;
        double t1 = best_encode(t, &texts[k], NULL, (int)reps, &serial);
        printf("%-6s %9.2f %9zu %7.2f MB/s", names[k], mbytes, serial.n, mbytes / t1);
        for (long th = 2; th <= maxth; th *= 2) {
            pool *p = pool_new((int)th, &err);
            if (!p) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            double tp = best_encode(t, &texts[k], p, (int)reps, &par);
            pool_free(p);
            if (par.n != serial.n || memcmp(par.v, serial.v, serial.n * sizeof *serial.v)) {
                fprintf(stderr, "\nparallel encoding differs from serial on %s\n", names[k]);
                return 1;
            }
            printf(" %7.2f MB/s %7.2fx", mbytes / tp, t1 / tp);
        }
        /* decode: whole, then one id at a time through the streaming detokenizer */
        double bd = 1e30, bs = 1e30;
        for (int r = 0; r < reps; r++) {
            char *txt;
            size_t len;
            double a = timer_now();
            if (tok_decode(t, serial.v, serial.n, 0, &txt, &len, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            double dt = timer_now() - a;
            if (len != texts[k].n || memcmp(txt, texts[k].p, len)) {
                fprintf(stderr, "\ndecode(encode(%s)) differs from the text\n", names[k]);
                return 1;
            }
            free(txt);
            bd = dt < bd ? dt : bd;
            tok_stream st;
            if (tok_stream_init(&st, t, 0, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            size_t total = 0, n;
            a = timer_now();
            for (size_t i = 0; i < serial.n; i++) {
                tok_stream_feed(&st, serial.v[i], &n);
                total += n;
            }
            tok_stream_flush(&st, &n);
            dt = timer_now() - a;
            tok_stream_free(&st);
            if (total + n != texts[k].n) {
                fprintf(stderr, "\nstreaming decode lost bytes on %s\n", names[k]);
                return 1;
            }
            bs = dt < bs ? dt : bs;
        }
        printf(" %6.1f MB/s %6.1f MB/s\n", mbytes / bd, mbytes / bs);
        tok_ids_free(&serial);
        tok_ids_free(&par);
    }
    for (int k = 0; k < 3; k++)
        free(texts[k].p);
    tok_free(t);
    return 0;
}
