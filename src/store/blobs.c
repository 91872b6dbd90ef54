/* blobs.c — see blobs.h. */
#include "store/blobs.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* expert_blob holds experts; spine and global blobs are found through `other`, indexed by
 * layer + 1 (0 = globals) */
static int *blob_slot(blob_table *t, int *other, int kind, int layer, int expert)
{
    if (kind == BLOB_EXPERT)
        return &t->expert_blob[(size_t)layer * t->n_experts + expert];
    return &other[kind == BLOB_GLOBAL ? 0 : layer + 1];
}

void blob_name(const blob *b, char *buf, size_t cap)
{
    if (b->kind == BLOB_EXPERT)
        snprintf(buf, cap, "layer %d expert %d", b->layer, b->expert);
    else if (b->kind == BLOB_SPINE)
        snprintf(buf, cap, "layer %d spine", b->layer);
    else
        snprintf(buf, cap, "globals");
}

/* where a matrix's data or scale pointer lies in blob b's parts */
static int locate(const blob_table *t, const model *m, const blob *b, const uint8_t *p, uint64_t *off)
{
    uintptr_t a = (uintptr_t)p; /* compared as integers: p and the tensors may be unrelated objects */
    for (int i = 0; i < b->nparts; i++) {
        const blob_part *pt = &t->part[b->first_part + i];
        uintptr_t lo = (uintptr_t)m->st.t[pt->tensor].data + pt->src;
        if (a >= lo && a - lo < pt->len) {
            *off = pt->off + (a - lo);
            return 0;
        }
    }
    return -1;
}

/* a binding's place in tensor order (names are sorted), then offset */
typedef struct bind_key {
    int tensor;
    uint64_t off;
    int i; /* the binding */
} bind_key;

static int by_tensor(const void *a, const void *b)
{
    const bind_key *x = a, *y = b;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

int blob_table_build(blob_table *t, const model *m, errbuf *err)
{
    memset(t, 0, sizeof *t);
    t->n_layers = m->hp.n_layers;
    t->n_experts = m->hp.n_experts > 0 ? m->hp.n_experts : 1;
    size_t ne = (size_t)t->n_layers * t->n_experts, nb = (size_t)(m->n_bind ? m->n_bind : 1);
    t->expert_blob = malloc(sizeof(int) * ne);
    t->layer_blob = malloc(sizeof(int) * (size_t)(t->n_layers ? t->n_layers : 1));
    t->part = malloc(sizeof *t->part * nb);
    t->b = malloc(sizeof *t->b * nb);
    int *owner = malloc(sizeof(int) * nb), *order = malloc(sizeof(int) * nb);
    bind_key *keys = malloc(sizeof *keys * nb);
    int *other = malloc(sizeof(int) * (size_t)(t->n_layers + 1));
    if (!t->expert_blob || !t->layer_blob || !t->part || !t->b || !owner || !order || !keys || !other) {
        errbuf_set(err, "blob table: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < ne; i++)
        t->expert_blob[i] = -1;
    for (int i = 0; i <= t->n_layers; i++)
        other[i] = -1;
    /* bindings in tensor order (names are sorted), then offset: blobs are numbered in the order of
     * their first tensor, parts follow in that order; a range bound twice (a tied head, say) is
     * one part */
    for (int i = 0; i < m->n_bind; i++)
        keys[i] = (bind_key){m->bind[i].tensor, m->bind[i].off, i};
    qsort(keys, (size_t)m->n_bind, sizeof *keys, by_tensor);
    for (int i = 0; i < m->n_bind; i++)
        order[i] = keys[i].i;
    for (int k = 0; k < m->n_bind; k++) {
        int i = order[k];
        const model_bind *x = &m->bind[i];
        int kind = x->part, layer = x->layer, expert = x->expert;
        assert(kind == BLOB_GLOBAL || (layer >= 0 && layer < t->n_layers));
        assert(kind != BLOB_EXPERT || (expert >= 0 && expert < t->n_experts));
        int *slot = blob_slot(t, other, kind, layer, expert);
        if (*slot < 0) {
            int b = *slot = t->n++;
            memset(&t->b[b], 0, sizeof t->b[b]);
            t->b[b].kind = kind;
            t->b[b].layer = kind == BLOB_GLOBAL ? -1 : layer;
            t->b[b].expert = kind == BLOB_EXPERT ? expert : -1;
        }
        owner[i] = *slot;
    }
    for (int i = 0; i < m->n_bind; i++)
        t->b[owner[i]].nparts++;
    int at = 0;
    for (int b = 0; b < t->n; b++) {
        t->b[b].first_part = at;
        at += t->b[b].nparts;
        t->b[b].nparts = 0;
    }
    for (int k = 0; k < m->n_bind; k++) {
        const model_bind *x = &m->bind[order[k]];
        blob *y = &t->b[owner[order[k]]];
        blob_part *last = y->nparts ? &t->part[y->first_part + y->nparts - 1] : NULL;
        if (last && last->tensor == x->tensor && last->src == x->off && last->len == x->len)
            continue;
        t->part[y->first_part + y->nparts++] = (blob_part){x->tensor, x->off, 0, x->len, x->role};
    }
    t->nparts = 0;
    for (int b = 0; b < t->n; b++)
        t->nparts += t->b[b].nparts;
    t->global_blob = other[0];
    for (int i = 0; i < t->n_layers; i++)
        t->layer_blob[i] = other[i + 1];
    for (int b = 0; b < t->n; b++) {
        blob *x = &t->b[b];
        uint64_t off = 0;
        for (int k = 0; k < x->nparts; k++) {
            blob_part *pt = &t->part[x->first_part + k];
            off = (off + 63) & ~(uint64_t)63;
            pt->off = off;
            off += pt->len;
        }
        x->size = off;
        if (x->kind == BLOB_EXPERT) {
            t->expert_bytes += x->size;
            if (x->size > t->max_expert)
                t->max_expert = x->size;
            const mlp_w *e = &m->L[x->layer].moe.experts[x->expert];
            const kmat *mats[3] = {&e->gate, &e->up, &e->down};
            for (int k = 0; k < 3; k++) {
                if (locate(t, m, x, mats[k]->data, &x->mat_data[k]) != 0 ||
                    (mats[k]->scale && locate(t, m, x, mats[k]->scale, &x->mat_scale[k]) != 0)) {
                    errbuf_set(err, "%s: layer %d expert %d: a matrix is not inside its expert's tensors", m->dir,
                               x->layer, x->expert);
                    goto fail;
                }
            }
        } else {
            t->spine_bytes += x->size;
        }
    }
    free(owner);
    free(order);
    free(keys);
    free(other);
    return 0;
fail:
    free(owner);
    free(order);
    free(keys);
    free(other);
    blob_table_free(t);
    return -1;
}

int blob_part_is_slice(const blob_part *p, const model *m)
{
    const st_tensor *x = &m->st.t[p->tensor];
    return p->src != 0 || p->len != x->end - x->begin;
}

void blob_part_tensor(const blob_table *t, const model *m, int b, const blob_part *p, char *name, size_t cap,
                      int *ndim, int64_t *shape)
{
    const st_tensor *x = &m->st.t[p->tensor];
    snprintf(name, cap, "%s", x->name);
    *ndim = x->ndim;
    memcpy(shape, x->shape, sizeof x->shape);
    if (!blob_part_is_slice(p, m))
        return;
    /* "<prefix>experts.gate_up_proj" [E, 2I, D] or "<prefix>experts.down_proj" [E, D, I] */
    const char *cut = strstr(x->name, "experts.");
    int len = cut ? (int)(cut - x->name) : (int)strlen(x->name);
    static const char *const role_name[] = {[MODEL_ROLE_GATE] = "gate_proj", [MODEL_ROLE_UP] = "up_proj",
                                            [MODEL_ROLE_DOWN] = "down_proj"};
    assert(p->role >= MODEL_ROLE_GATE && p->role <= MODEL_ROLE_DOWN && x->ndim == 3);
    snprintf(name, cap, "%.*sexperts.%d.%s.weight", len, x->name, t->b[b].expert, role_name[p->role]);
    *ndim = 2;
    shape[0] = p->role == MODEL_ROLE_DOWN ? x->shape[1] : x->shape[1] / 2;
    shape[1] = x->shape[2];
}

void blob_table_free(blob_table *t)
{
    free(t->b);
    free(t->part);
    free(t->expert_blob);
    free(t->layer_blob);
    memset(t, 0, sizeof *t);
}

int blob_bind_layer(const blob_table *t, const model *m, int b, const uint8_t *base, layer_w *out)
{
    const blob *x = &t->b[b];
    *out = m->L[x->layer];
    kmat *mats[MODEL_LAYER_MATS];
    int n = model_layer_mats(out, mats);
    for (int k = 0; k < n; k++) {
        uint64_t off;
        if (locate(t, m, x, mats[k]->data, &off) != 0)
            return -1;
        mats[k]->data = base + off;
        if (mats[k]->scale) {
            if (locate(t, m, x, mats[k]->scale, &off) != 0)
                return -1;
            mats[k]->scale = base + off;
        }
    }
    return 0;
}

void blob_bind_expert(const blob_table *t, const model *m, int b, const uint8_t *base, mlp_w *out)
{
    const blob *x = &t->b[b];
    *out = m->L[x->layer].moe.experts[x->expert];
    kmat *mats[3] = {&out->gate, &out->up, &out->down};
    for (int k = 0; k < 3; k++) {
        mats[k]->data = base + x->mat_data[k];
        if (mats[k]->scale)
            mats[k]->scale = base + x->mat_scale[k];
    }
}
