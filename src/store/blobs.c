/* blobs.c — see blobs.h. */
#include "store/blobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_index(const char *name, const char *key)
{
    const char *p = strstr(name, key);
    if (!p)
        return -1;
    p += strlen(key);
    if (*p < '0' || *p > '9')
        return -1;
    long v = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((v = v * 10 + (*p - '0')) > 1000000)
            return 1000000; /* beyond any layer or expert count: rejected by the caller */
    return (int)v;
}

/* kind/layer/expert of a tensor name; -1 when the text model does not use it */
static int classify(const model *m, const char *name, int *layer, int *expert)
{
    if (!strncmp(name, "vision_tower.", 13) || !strncmp(name, "mm_projector.", 13) ||
        !strncmp(name, "model.visual", 12))
        return -1;
    *layer = parse_index(name, "layers.");
    *expert = -1;
    if (*layer < 0)
        return BLOB_GLOBAL;
    if (*layer >= m->hp.n_layers) /* MTP and other extra layers */
        return -1;
    *expert = parse_index(name, ".experts.");
    return *expert >= 0 ? BLOB_EXPERT : BLOB_SPINE;
}

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
        const st_tensor *x = &m->st.t[pt->tensor];
        uintptr_t lo = (uintptr_t)x->data;
        if (a >= lo && a - lo < x->end - x->begin) {
            *off = pt->off + (a - lo);
            return 0;
        }
    }
    return -1;
}

int blob_table_build(blob_table *t, const model *m, errbuf *err)
{
    memset(t, 0, sizeof *t);
    const st_set *s = &m->st;
    t->n_layers = m->hp.n_layers;
    t->n_experts = m->hp.n_experts > 0 ? m->hp.n_experts : 1;
    size_t ne = (size_t)t->n_layers * t->n_experts;
    t->expert_blob = malloc(sizeof(int) * ne);
    t->layer_blob = malloc(sizeof(int) * (size_t)(t->n_layers ? t->n_layers : 1));
    t->part = malloc(sizeof *t->part * (size_t)(s->n ? s->n : 1));
    t->b = malloc(sizeof *t->b * (size_t)(s->n ? s->n : 1));
    if (!t->expert_blob || !t->layer_blob || !t->part || !t->b) {
        blob_table_free(t);
        return errbuf_set(err, "blob table: out of memory");
    }
    for (size_t i = 0; i < ne; i++)
        t->expert_blob[i] = -1;
    /* tensors are sorted by name, so a blob's tensors are found in name order; a blob's parts
     * are collected in a second pass so they are contiguous in t->part */
    int *owner = malloc(sizeof(int) * (size_t)(s->n ? s->n : 1));
    int *other = malloc(sizeof(int) * (size_t)(t->n_layers + 1));
    if (!owner || !other) {
        free(owner);
        free(other);
        blob_table_free(t);
        return errbuf_set(err, "blob table: out of memory");
    }
    for (int i = 0; i <= t->n_layers; i++)
        other[i] = -1;
    for (int i = 0; i < s->n; i++) {
        int layer, expert, kind = classify(m, s->t[i].name, &layer, &expert);
        owner[i] = -1;
        if (kind < 0)
            continue;
        if (kind == BLOB_EXPERT && (expert >= t->n_experts || m->hp.ffn_kind[layer] != FFN_MOE)) {
            if (expert >= t->n_experts)
                errbuf_set(err, "%s: tensor '%s' names expert %d of %d", m->dir, s->t[i].name, expert, t->n_experts);
            else
                errbuf_set(err, "%s: tensor '%s' is an expert of layer %d, which has no mixture of experts", m->dir,
                           s->t[i].name, layer);
            goto fail;
        }
        int *slot = blob_slot(t, other, kind, layer, expert);
        if (*slot < 0) {
            int b = *slot = t->n++;
            memset(&t->b[b], 0, sizeof t->b[b]);
            t->b[b].kind = kind;
            t->b[b].layer = kind == BLOB_GLOBAL ? -1 : layer;
            t->b[b].expert = expert;
        }
        owner[i] = *slot;
    }
    /* bucket the tensors by blob (counting sort keeps name order inside a blob) */
    for (int i = 0; i < s->n; i++)
        if (owner[i] >= 0)
            t->b[owner[i]].nparts++;
    int at = 0;
    for (int b = 0; b < t->n; b++) {
        t->b[b].first_part = at;
        at += t->b[b].nparts;
        t->b[b].nparts = 0;
    }
    for (int i = 0; i < s->n; i++)
        if (owner[i] >= 0) {
            blob *x = &t->b[owner[i]];
            t->part[x->first_part + x->nparts++].tensor = i;
        }
    t->nparts = at;
    t->global_blob = other[0];
    for (int i = 0; i < t->n_layers; i++)
        t->layer_blob[i] = other[i + 1];
    for (int b = 0; b < t->n; b++) {
        blob *x = &t->b[b];
        uint64_t off = 0;
        for (int k = 0; k < x->nparts; k++) {
            blob_part *pt = &t->part[x->first_part + k];
            const st_tensor *tt = &s->t[pt->tensor];
            off = (off + 63) & ~(uint64_t)63;
            pt->off = off;
            pt->len = tt->end - tt->begin;
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
    free(other);
    return 0;
fail:
    free(owner);
    free(other);
    blob_table_free(t);
    return -1;
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
