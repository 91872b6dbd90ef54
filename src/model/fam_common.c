/* fam_common.c — tensor binders shared by the family adapters: MLA attention, a gated MLP,
 * and routed experts in either on-disk layout. */
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

int fam_bind_mla(model *m, const char *p, mla_w *w, errbuf *err)
{
    const hparams *hp = &m->hp;
    int H = hp->hidden, nh = hp->n_heads, qd = hp->qk_nope + hp->qk_rope, r = hp->kv_lora_rank;
    if (hp->q_lora_rank > 0) {
        if (model_mat(m, &w->q_a, hp->q_lora_rank, H, err, "%sq_a_proj", p) ||
            model_vec(m, &w->q_a_norm, hp->q_lora_rank, 0, err, "%sq_a_layernorm.weight", p) ||
            model_mat(m, &w->q_b, nh * qd, hp->q_lora_rank, err, "%sq_b_proj", p))
            return -1;
    } else if (model_mat(m, &w->q, nh * qd, H, err, "%sq_proj", p)) {
        return -1;
    }
    if (model_mat(m, &w->kv_a, r + hp->qk_rope, H, err, "%skv_a_proj_with_mqa", p) ||
        model_vec(m, &w->kv_a_norm, r, 0, err, "%skv_a_layernorm.weight", p) ||
        model_mat(m, &w->kv_b, nh * (hp->qk_nope + hp->v_head), r, err, "%skv_b_proj", p) ||
        model_mat(m, &w->o, H, nh * hp->v_head, err, "%so_proj", p))
        return -1;
    if (hp->mla_out_gate && model_mat(m, &w->g, nh * hp->v_head, H, err, "%sg_proj", p))
        return -1;
    return 0;
}

int fam_bind_mlp(model *m, mlp_w *w, int inter, int width, errbuf *err, const char *p, const char *gate,
                 const char *up, const char *down)
{
    model_bind sc = m->scope;
    int rc = 0;
    m->scope.role = MODEL_ROLE_GATE;
    rc = rc || model_mat(m, &w->gate, inter, width, err, "%s%s", p, gate);
    m->scope.role = MODEL_ROLE_UP;
    rc = rc || model_mat(m, &w->up, inter, width, err, "%s%s", p, up);
    m->scope.role = MODEL_ROLE_DOWN;
    rc = rc || model_mat(m, &w->down, width, inter, err, "%s%s", p, down);
    m->scope = sc;
    return rc ? -1 : 0;
}


static int fmt_of(int st)
{
    return st == ST_BF16 ? WF_BF16 : st == ST_F16 ? WF_F16 : st == ST_F32 ? WF_F32 : -1;
}

const char *const FAM_EXPERT_NAMES[3] = {"gate_proj", "up_proj", "down_proj"};

int fam_bind_experts(model *m, int layer, const char *p, moe_w *moe, int width, const char *const names[3],
                     errbuf *err)
{
    const hparams *hp = &m->hp;
    int E = hp->n_experts, I = hp->moe_inter, rc = 0;
    moe->experts = calloc((size_t)E, sizeof *moe->experts);
    if (!moe->experts)
        return errbuf_set(err, "%s: out of memory", m->dir);
    model_bind sc = m->scope;
    if (!model_has(m, "%sexperts.gate_up_proj", p)) {
        for (int e = 0; e < E && rc == 0; e++) {
            char ep[500];
            snprintf(ep, sizeof ep, "%sexperts.%d.", p, e);
            model_scope(m, MODEL_PART_EXPERT, layer, e, MODEL_ROLE_OTHER);
            rc = fam_bind_mlp(m, &moe->experts[e], I, width, err, ep, names[0], names[1], names[2]);
        }
        m->scope = sc;
        return rc;
    }
    char n1[500], n2[500];
    snprintf(n1, sizeof n1, "%sexperts.gate_up_proj", p);
    snprintf(n2, sizeof n2, "%sexperts.down_proj", p);
    const st_tensor *gu = st_find(&m->st, n1), *dn = st_find(&m->st, n2);
    if (!dn)
        return errbuf_set(err, "%s: missing tensor '%s'", m->dir, n2);
    int fg = fmt_of(gu->dtype), fd = fmt_of(dn->dtype);
    if (fg < 0 || fd < 0)
        return errbuf_set(err, "%s: fused experts '%s' must be BF16, F16 or F32", m->dir, n1);
    if (gu->ndim != 3 || gu->shape[0] != E || gu->shape[1] != 2 * I || gu->shape[2] != width)
        return errbuf_set(err, "%s: tensor '%s' must have shape [%d, %d, %d]", m->dir, n1, E, 2 * I, width);
    if (dn->ndim != 3 || dn->shape[0] != E || dn->shape[1] != width || dn->shape[2] != I)
        return errbuf_set(err, "%s: tensor '%s' must have shape [%d, %d, %d]", m->dir, n2, E, width, I);
    size_t gs = (size_t)st_dtype_size(gu->dtype), ds = (size_t)st_dtype_size(dn->dtype);
    uint64_t one = (uint64_t)I * width * gs, dn1 = (uint64_t)width * I * ds; /* one matrix's bytes */
    for (int e = 0; e < E && rc == 0; e++) { /* each expert's gate, up and down are slices: it streams */
        const uint8_t *g = gu->data + (size_t)e * 2 * one;
        kmat_init(&moe->experts[e].gate, fg, I, width, g, NULL);
        kmat_init(&moe->experts[e].up, fg, I, width, g + one, NULL);
        kmat_init(&moe->experts[e].down, fd, width, I, dn->data + (size_t)e * dn1, NULL);
        model_scope(m, MODEL_PART_EXPERT, layer, e, MODEL_ROLE_GATE);
        rc = model_bind_range(m, gu, (uint64_t)e * 2 * one, one, err);
        m->scope.role = MODEL_ROLE_UP;
        rc = rc || model_bind_range(m, gu, (uint64_t)e * 2 * one + one, one, err);
        m->scope.role = MODEL_ROLE_DOWN;
        rc = rc || model_bind_range(m, dn, (uint64_t)e * dn1, dn1, err);
    }
    m->scope = sc;
    if (rc)
        return -1;
    if ((size_t)width > m->max_cols)
        m->max_cols = (size_t)width;
    if ((size_t)I > m->max_cols)
        m->max_cols = (size_t)I;
    return 0;
}

int fam_bind_globals(model *m, const char *base, const char *prefix, errbuf *err)
{
    const hparams *hp = &m->hp;
    int H = hp->hidden;
    model_scope(m, MODEL_PART_GLOBAL, -1, -1, MODEL_ROLE_OTHER);
    if (model_mat(m, &m->embed, hp->vocab, H, err, "%sembed_tokens", base) ||
        model_vec(m, &m->final_norm, H, 0, err, "%snorm.weight", base))
        return -1;
    if (model_has(m, "%slm_head.weight", prefix) || !hp->tie_embeddings)
        return model_mat(m, &m->lm_head, hp->vocab, H, err, "%slm_head", prefix);
    m->lm_head = m->embed;
    return 0;
}
