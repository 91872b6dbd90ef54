/* plan.c — the residency planner (store.h: store_plan_make): what a RAM budget keeps resident
 * and what streams.
 *
 * Per byte of RAM, a layer's spine saves a read every token (every pass uses every layer), a
 * routed expert only when the router picks it (top_k of n_experts, < 1). So the spine comes
 * first: the globals (embedding, final norm, output head) always stay resident, then as many
 * layer spines as fit; the rest of the budget holds the expert cache, which keeps the most
 * often routed experts (cache.c). One exception: the expert slots a MoE pass works with (a
 * layer's experts in use and the next layer's guesses, `working`) are kept before any spine, as
 * many of them as the budget affords, since with fewer every layer's experts are read a few
 * slots at a time (measured: 2 slots left the drive 9 requests deep instead of ~30). When not
 * every spine fits, the streamed layers are spread evenly over the depth, so that each one's read
 * overlaps the compute of the resident layers before it, and they share STORE_SPINE_SLOTS slots
 * of the largest streamed spine: the layer in use, and the next one loading. The plan depends on nothing
 * but the blob sizes and the budget, so the same budget gives the same plan on every run.
 * With a device backend (STORE_PLAN_DEVICE) the spines live in the device's memory once it has
 * copied them, so the budget holds the globals (the host's drafters read the embedding and the
 * head) and then experts only: device memory, then RAM, then the drive, each tier holding what the
 * one above it does not (weight_src.held and adopt, model/blk.h).
 */
#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "store/store.h"

const char *store_fmt_bytes(double n, char *buf, size_t cap)
{
    if (n >= 1000000000)
        snprintf(buf, cap, "%.2f GB", n / 1e9);
    else if (n >= 1000000)
        snprintf(buf, cap, "%.1f MB", n / 1e6);
    else
        snprintf(buf, cap, "%.0f KB", n / 1e3);
    return buf;
}

/* 1 if layer i of n is one of n_s streamed layers spread evenly over the n (the last layer of
 * each of n_s equal runs) */
static int spread(int i, int n, int n_s)
{
    return (int)((int64_t)(i + 1) * n_s / n) > (int)((int64_t)i * n_s / n);
}

/* expert slots for what the budget leaves after `used` bytes (never past INT_MAX: store_open caps
 * them at the number of experts anyway) */
static int slots_left(uint64_t budget, uint64_t used, uint64_t X)
{
    uint64_t n = (budget - used) / X;
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* the plan with at least min_x expert slots, or -1 if the budget cannot hold it */
static int plan_try(const blob_table *bt, uint64_t budget, unsigned flags, int min_x, store_plan *p)
{
    int stream_all = (flags & STORE_PLAN_STREAM_ALL) != 0;
    int n = bt->n_layers;
    uint64_t globals = bt->global_blob >= 0 ? bt->b[bt->global_blob].size : 0, layers = 0;
    for (int i = 0; i < n; i++)
        if (bt->layer_blob[i] >= 0)
            layers += bt->b[bt->layer_blob[i]].size;
    memset(p, 0, sizeof *p);
    p->budget = budget;
    p->working = min_x;
    p->expert_slot_bytes = blob_padded(bt->max_expert);
    uint64_t X = p->expert_slot_bytes, need_x = (uint64_t)min_x * X;
    if (flags & STORE_PLAN_DEVICE) { /* every spine mapped, charged to the device */
        if (budget < globals + need_x)
            return -1;
        p->resident_bytes = globals + layers;
        p->device_bytes = layers;
        p->expert_slots = slots_left(budget, globals, X);
        return 0;
    }
    if (!stream_all && budget >= globals + layers + need_x) { /* every spine resident */
        p->resident_bytes = globals + layers;
        p->expert_slots = slots_left(budget, p->resident_bytes, X);
        return 0;
    }
    /* the fewest streamed layers (spread evenly) whose slots and the rest of the spine fit */
    for (int n_s = stream_all ? n : 1; n_s <= n; n_s++) {
        uint64_t slot = 0, kept = globals;
        for (int i = 0; i < n; i++) {
            int b = bt->layer_blob[i];
            if (b < 0)
                continue;
            if (spread(i, n, n_s)) {
                uint64_t sz = blob_padded(bt->b[b].size);
                slot = sz > slot ? sz : slot;
            } else {
                kept += bt->b[b].size;
            }
        }
        if (slot == 0 || budget < kept + (uint64_t)STORE_SPINE_SLOTS * slot + need_x)
            continue;
        p->resident_bytes = kept;
        p->spine_slots = STORE_SPINE_SLOTS;
        p->spine_slot_bytes = slot;
        for (int i = 0; i < n; i++)
            if (bt->layer_blob[i] >= 0 && spread(i, n, n_s)) {
                p->streamed[i] = 1;
                p->spine_streamed++;
            }
        p->expert_slots = slots_left(budget, kept + (uint64_t)STORE_SPINE_SLOTS * slot, X);
        return 0;
    }
    return -1;
}

int store_plan_make(const blob_table *bt, uint64_t budget, unsigned flags, int working, store_plan *p, errbuf *err)
{
    assert(!((flags & STORE_PLAN_STREAM_ALL) && (flags & STORE_PLAN_DEVICE)));
    if (bt->n_layers > MODEL_MAX_LAYERS)
        return errbuf_set(err, "store plan: %d layers exceed %d", bt->n_layers, MODEL_MAX_LAYERS);
    int experts = 0;
    for (int b = 0; b < bt->n; b++)
        experts += bt->b[b].kind == BLOB_EXPERT;
    if (working > experts) /* a working set larger than the model's experts is all of them */
        working = experts;
    /* the largest working set the budget affords, from 2 x top_k down to the least */
    for (int w = working; w >= STORE_MIN_EXPERT_SLOTS; w--)
        if (plan_try(bt, budget, flags, w, p) == 0)
            return 0;
    if (working < STORE_MIN_EXPERT_SLOTS && plan_try(bt, budget, flags, STORE_MIN_EXPERT_SLOTS, p) == 0)
        return 0;
    uint64_t slot = 0, globals = bt->global_blob >= 0 ? bt->b[bt->global_blob].size : 0;
    char h1[32], h2[32], h3[32], h4[32];
    if (flags & STORE_PLAN_DEVICE)
        return errbuf_set(err,
                          "RAM budget %s is below what a device's weight store keeps in RAM: the globals (%s) and %d "
                          "experts (%s each)",
                          store_fmt_bytes(budget, h1, sizeof h1), store_fmt_bytes(globals, h2, sizeof h2),
                          STORE_MIN_EXPERT_SLOTS, store_fmt_bytes(blob_padded(bt->max_expert), h4, sizeof h4));
    for (int i = 0; i < bt->n_layers; i++)
        if (bt->layer_blob[i] >= 0 && blob_padded(bt->b[bt->layer_blob[i]].size) > slot)
            slot = blob_padded(bt->b[bt->layer_blob[i]].size);
    return errbuf_set(err,
                      "RAM budget %s is below the least the model streams with: the globals (%s), %d layers' "
                      "spine slots (%s each) and %d experts (%s each)",
                      store_fmt_bytes(budget, h1, sizeof h1), store_fmt_bytes(globals, h2, sizeof h2),
                      STORE_SPINE_SLOTS, store_fmt_bytes(slot, h3, sizeof h3), STORE_MIN_EXPERT_SLOTS,
                      store_fmt_bytes(blob_padded(bt->max_expert), h4, sizeof h4));
}
