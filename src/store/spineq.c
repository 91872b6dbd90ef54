/* spineq.c — see spineq.h. */
#include "store/spineq.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tensors by where their bytes are mapped, to find the tensor a matrix views */
typedef struct {
    uintptr_t data;
    int tensor;
} by_addr;

static int cmp_addr(const void *a, const void *b)
{
    uintptr_t x = ((const by_addr *)a)->data, y = ((const by_addr *)b)->data;
    return (x > y) - (x < y);
}

/* the tensor that is exactly matrix k (its first byte and its whole length), or -1 */
static int whole_tensor(const model *m, const by_addr *idx, const kmat *k)
{
    by_addr key = {(uintptr_t)k->data, 0};
    const by_addr *hit = bsearch(&key, idx, (size_t)m->st.n, sizeof *idx, cmp_addr);
    if (!hit)
        return -1;
    while (hit > idx && hit[-1].data == key.data) /* a zero-length tensor may share the address */
        hit--;
    for (; hit < idx + m->st.n && hit->data == key.data; hit++) {
        const st_tensor *t = &m->st.t[hit->tensor];
        if (t->ndim == 2 && t->shape[0] == k->rows && t->shape[1] == k->cols &&
            t->end - t->begin == (uint64_t)k->rows * k->row_bytes)
            return hit->tensor;
    }
    return -1;
}

static int st_fmt(int dtype) { return dtype == ST_BF16 ? WF_BF16 : dtype == ST_F16 ? WF_F16 : WF_F32; }

/* A non-finite weight cannot be coded; found here, before prepare writes anything (found while
 * writing, it would leave a store that fails at the same blob on every rerun). */
static int check_finite(const model *m, const st_tensor *t, errbuf *err)
{
    int fmt = st_fmt(t->dtype), rows = (int)t->shape[0], cols = (int)t->shape[1];
    kmat w;
    kmat_init(&w, fmt, rows, cols, t->data, NULL);
    float v[32];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c += 32) {
            wfmt_table[fmt].decode(&w, r, c, c + 32, v);
            for (int j = 0; j < 32; j++)
                if (!isfinite(v[j]))
                    return errbuf_set(err, "%s: tensor '%s' row %d column %d is not finite; --spine int8 cannot code it",
                                      m->st.files[t->file].path, t->name, r, c + j);
        }
    return 0;
}

/* Marks (want[t] = 1) the spine matrices spineq.h says are quantized. */
static int choose(const model *m, unsigned char *want, errbuf *err)
{
    by_addr *idx = malloc(sizeof *idx * (size_t)(m->st.n ? m->st.n : 1));
    if (!idx)
        return errbuf_set(err, "prepare --spine int8: out of memory");
    for (int i = 0; i < m->st.n; i++)
        idx[i] = (by_addr){(uintptr_t)m->st.t[i].data, i};
    qsort(idx, (size_t)m->st.n, sizeof *idx, cmp_addr);
    for (int l = 0; l < m->hp.n_layers; l++) {
        layer_w L = m->L[l];
        kmat *mats[MODEL_LAYER_MATS];
        int n = model_layer_mats(&L, mats);
        for (int k = 0; k < n; k++) {
            const kmat *x = mats[k];
            int plain = x->fmt == WF_BF16 || x->fmt == WF_F16 || x->fmt == WF_F32;
            int t = mats[k] == &L.moe.router || !plain || x->cols % 32 ? -1 : whole_tensor(m, idx, x);
            if (t >= 0) {
                const char *nm = m->st.t[t].name;
                size_t len = strlen(nm);
                char sc[600];
                snprintf(sc, sizeof sc, "%s_scale", nm);
                /* only "X.weight", and only if "X.weight_scale" is free for the scales (and short
                 * enough for the loader's name buffers) */
                want[t] = len > 7 && len + 6 < 500 && !strcmp(nm + len - 7, ".weight") && !st_find(&m->st, sc);
                if (want[t] && check_finite(m, &m->st.t[t], err) != 0) {
                    free(idx);
                    return -1;
                }
            }
        }
    }
    free(idx);
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

int spineq_plan(spineq *q, const model *m, errbuf *err)
{
    memset(q, 0, sizeof *q);
    int n = m->st.n;
    unsigned char *want = calloc((size_t)n + 1, 1);
    st_tensor *t = calloc(2 * (size_t)n + 1, sizeof *t);
    if (!want || !t) {
        free(want);
        free(t);
        return errbuf_set(err, "prepare --spine int8: out of memory");
    }
    q->t = t;
    if (choose(m, want, err) != 0)
        goto fail;
    /* the source index and role ride in file/file_off while the list is sorted (new tensors have
     * no file), then move to their own arrays */
    for (int i = 0; i < n; i++) {
        const st_tensor *s = &m->st.t[i];
        st_tensor *d = &t[q->n++];
        *d = *s;
        d->name = NULL;
        if (!want[i]) {
            d->name = strdup(s->name);
            d->file_off = (uint64_t)i << 2 | SPINEQ_COPY;
            if (!d->name)
                goto oom;
            continue;
        }
        int64_t rows = s->shape[0], cols = s->shape[1];
        char sc[600];
        snprintf(sc, sizeof sc, "%s_scale", s->name);
        d->name = strdup(s->name);
        d->dtype = ST_I8;
        d->data = NULL;
        d->begin = 0;
        d->end = (uint64_t)rows * (uint64_t)cols;
        d->file_off = (uint64_t)i << 2 | SPINEQ_CODES;
        st_tensor *e = &t[q->n++];
        *e = *d;
        e->name = strdup(sc);
        e->dtype = ST_BF16;
        e->shape[1] = cols / 32;
        e->end = (uint64_t)rows * (uint64_t)(cols / 32) * 2;
        e->file_off = (uint64_t)i << 2 | SPINEQ_SCALES;
        if (!d->name || !e->name)
            goto oom;
        q->nmat++;
        q->bytes_in += s->end - s->begin;
        q->bytes_out += d->end + e->end;
    }
    if (q->nmat == 0) {
        errbuf_set(err, "%s: no layer matrix is BF16, F16 or F32 with a multiple of 32 columns; --spine int8 has "
                        "nothing to code (prepare it without)",
                   m->dir);
        goto fail;
    }
    qsort(t, (size_t)q->n, sizeof *t, cmp_name);
    q->src = malloc(sizeof(int) * (size_t)q->n);
    q->role = malloc((size_t)q->n);
    if (!q->src || !q->role)
        goto oom;
    for (int i = 0; i < q->n; i++) {
        q->src[i] = (int)(t[i].file_off >> 2);
        q->role[i] = (unsigned char)(t[i].file_off & 3);
        t[i].file_off = q->role[i] == SPINEQ_COPY ? m->st.t[q->src[i]].file_off : 0;
    }
    /* the bindings over the new list: first[i] is the store tensor of source i (its codes, with
     * the scales right after them: "X.weight" < "X.weight_scale", and nothing sorts between) */
    int *first = malloc(sizeof(int) * ((size_t)n + 1));
    q->bind = malloc(sizeof *q->bind * (2 * (size_t)m->n_bind + 1));
    if (!first || !q->bind) {
        free(first);
        goto oom;
    }
    for (int i = q->n - 1; i >= 0; i--)
        if (q->role[i] != SPINEQ_SCALES)
            first[q->src[i]] = i;
    for (int k = 0; k < m->n_bind; k++) {
        model_bind b = m->bind[k];
        int j = first[b.tensor];
        b.tensor = j;
        if (q->role[j] == SPINEQ_CODES) { /* a whole matrix: its codes, then its scales */
            assert(q->role[j + 1] == SPINEQ_SCALES && q->src[j + 1] == q->src[j]);
            b.off = 0;
            b.len = t[j].end;
            q->bind[q->n_bind++] = b;
            b.tensor = j + 1;
            b.len = t[j + 1].end;
        }
        q->bind[q->n_bind++] = b;
    }
    free(first);
    free(want);
    return 0;
oom:
    errbuf_set(err, "prepare --spine int8: out of memory");
fail:
    free(want);
    spineq_free(q);
    return -1;
}

void spineq_free(spineq *q)
{
    for (int i = 0; i < q->n; i++)
        free(q->t[i].name);
    free(q->t);
    free(q->src);
    free(q->role);
    free(q->bind);
    memset(q, 0, sizeof *q);
}

void spineq_view(const spineq *q, const model *m, model *view)
{
    *view = *m;
    view->st.t = q->t;
    view->st.n = q->n;
    view->bind = q->bind;
    view->n_bind = q->n_bind;
}

/* s = max|w| / 127 rounded up to a BF16 */
static uint16_t group_scale(float amax)
{
    float want = amax / 127.0f;
    uint16_t h = f32_to_bf16(want);
    if (bf16_to_f32(h) < want)
        h++; /* positive: the next BF16 up */
    return h;
}

void spineq_fill(const spineq *q, const model *m, int i, uint8_t *codes, uint8_t *scales)
{
    const st_tensor *s = &m->st.t[q->src[i]];
    int fmt = st_fmt(s->dtype);
    int rows = (int)s->shape[0], cols = (int)s->shape[1];
    kmat w;
    kmat_init(&w, fmt, rows, cols, s->data, NULL);
    float v[32];
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < cols / 32; g++) {
            wfmt_table[fmt].decode(&w, r, 32 * g, 32 * g + 32, v);
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax; /* finite: checked by spineq_plan */
            uint16_t h = group_scale(amax);
            uint8_t *so = scales + ((size_t)r * (size_t)(cols / 32) + (size_t)g) * 2;
            so[0] = (uint8_t)(h & 0xFF); /* little-endian, as safetensors */
            so[1] = (uint8_t)(h >> 8);
            float sc = bf16_to_f32(h);
            int8_t *o = (int8_t *)codes + (size_t)r * (size_t)cols + 32 * (size_t)g;
            for (int j = 0; j < 32; j++) {
                long c = sc > 0 ? lrintf(v[j] / sc) : 0;
                o[j] = (int8_t)(c > 127 ? 127 : c < -127 ? -127 : c);
            }
        }
}
