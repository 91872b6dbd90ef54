/* engine_report.c — the --stats lines about the weights: resident, or the store's figures with
 * each drive's read rate against what doctor measured for it (engine.h: engine_report). */
#include <string.h>

#include "base/timer.h"
#include "engine/engine_int.h"
#include "engine/stream.h"
#include "store/store.h"

/* " (Q of doctor's D GB/s) (P of the C GB/s doctor read the store's pack at) (R of the S GB/s doctor
 * sustained)": drive d's read rate against the drive's measured bests and the rate its tuning
 * kept up, each part when doctor measured it */
static const char *drive_ratios(io_engine *io, int d, double gbps, char *buf, size_t cap)
{
    double doc = io_drive_best_gbps(io, d), cold = io_drive_cold_gbps(io, d), emu = io_drive_emulated_gbps(io, d);
    double sus = io_drive_sustained_gbps(io, d);
    int n = 0;
    buf[0] = 0;
    if (emu > 0) { /* the emulation sets the pace: doctor's figures are the real disk's under it */
        snprintf(buf, cap, " (%.2f of its emulated %.2f GB/s)", gbps / emu, emu);
        return buf;
    }
    if (doc > 0)
        n = snprintf(buf, cap, " (%.2f of doctor's %.2f GB/s)", gbps / doc, doc);
    if (cold > 0 && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " (%.2f of the %.2f GB/s doctor read the store's pack at)",
                      gbps / cold, cold);
    if (sus > 0 && n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " (%.2f of the %.2f GB/s doctor sustained)", gbps / sus, sus);
    return buf;
}

void engine_report(engine *e, FILE *f, int tokens, double seconds)
{
    const char *spine = e->spine_int8 ? ", layer spines INT8 (prepare --spine int8)" : "";
    if (e->verified_blobs > 0) {
        char h[32];
        fprintf(f, "[stats] verified %d blobs used from the mapping (%s) at open in %.3f s (%.2f GB/s)\n",
                e->verified_blobs, store_fmt_bytes((double)e->verified_bytes, h, 32), e->verify_s,
                e->verify_s > 0 ? e->verified_bytes / 1e9 / e->verify_s : 0.0);
    }
    if (!e->store) {
        fprintf(f, "[stats] weights: all resident (mapped)%s\n", spine);
        return;
    }
    if (e->stream) {
        stream_counts c;
        char h[32];
        stream_counts_get(e->stream, &c);
        fprintf(f,
                "[stats] streamed from the hub: %d of %d experts on the drive, %d of them unverified (their shard "
                "not yet hashed whole; %d of %d shards verified); %d fetched by this run (%s in %.3f s)\n",
                c.experts_present, c.experts, c.experts_unverified, c.shards_verified, c.shards, c.fetched,
                store_fmt_bytes((double)c.bytes_fetched, h, 32), c.fetch_s);
    }
    store_stats st;
    store_stats_get(e->store, &st);
    const store_plan *pl = store_plan_get(e->store);
    double tok = tokens > 0 ? tokens : 1;
    char h1[32], h2[32], h3[32], h4[32];
    char where[160];
    if (pl->device_bytes) /* the device holds the spines; RAM the globals and the experts */
        snprintf(where, sizeof where,
                 "%s resident (globals; the %d layer spines, %s, on the device, %s of them let go from RAM)",
                 store_fmt_bytes(pl->resident_bytes - pl->device_bytes, h3, 32), e->m->hp.n_layers,
                 store_fmt_bytes(pl->device_bytes, h4, 32), store_fmt_bytes(e->spines_released, h1, 32));
    else
        snprintf(where, sizeof where, "%s resident (globals and %d of %d layer spines)",
                 store_fmt_bytes(pl->resident_bytes, h3, 32), e->m->hp.n_layers - pl->spine_streamed,
                 e->m->hp.n_layers);
    fprintf(f, "[stats] store: %s, %d expert slots of %s (%s), %s, prefetch %s (%s)%s\n",
            e->dfsp ? "DFSP" : "Hugging Face folder", store_slots(e->store),
            store_fmt_bytes(store_slot_bytes(e->store), h1, 32),
            store_fmt_bytes(store_slots(e->store) * (double)store_slot_bytes(e->store), h2, 32), where,
            store_weights(e->store)->prefetch ? "on" : "off", store_io_note(e->store), spine);
    if (pl->spine_streamed > 0)
        fprintf(f,
                "[stats] spine: %d layers streamed through %d slots of %s, %s read per token, %llu of %llu layers "
                "already in a slot, %llu read ahead (%llu used), stalled on I/O %.3f s\n",
                pl->spine_streamed, pl->spine_slots, store_fmt_bytes(pl->spine_slot_bytes, h1, 32),
                store_fmt_bytes(st.spine_bytes_read / tok, h2, 32), (unsigned long long)st.spine_hits,
                (unsigned long long)st.spine_requests, (unsigned long long)st.spine_prefetch_reads,
                (unsigned long long)st.spine_prefetch_hits, st.spine_stall_s);
    fprintf(f,
            "[stats] experts: %s read per token, hit rate %.1f%% (%llu/%llu), read amplification "
            "%.3f, stalled on I/O %.3f s, at most %llu read(s) of one blob per pass\n"
            "[stats] prefetch: %llu reads, %llu of them used by the layer they were for; %llu reads on "
            "demand\n",
            store_fmt_bytes(st.bytes_read / tok, h4, 32),
            st.requests ? 100.0 * (double)st.hits / (double)st.requests : 0.0, (unsigned long long)st.hits,
            (unsigned long long)st.requests, st.bytes_needed ? (double)st.bytes_read / (double)st.bytes_needed : 0.0,
            st.stall_s, (unsigned long long)st.max_reads_blob_pass, (unsigned long long)st.prefetch_reads,
            (unsigned long long)st.prefetch_hits, (unsigned long long)(st.reads - st.prefetch_reads));
    if (st.adopted)
        fprintf(f, "[stats] device: %llu experts the GPU dropped went back into RAM, not to the drive\n",
                (unsigned long long)st.adopted);
    io_engine *io = store_io(e->store);
    for (int d = 0; d < store_ndrives(e->store); d++) {
        io_drive_stats ds;
        io_stats(io, d, &ds);
        double run_gbps = seconds > 0 ? ds.bytes / 1e9 / seconds : 0.0;
        char vs[256];
        drive_ratios(io, d, run_gbps, vs, sizeof vs);
        fprintf(f,
                "[stats] drive %d (%s, depth %d x %s requests): %s in %llu reads, %.2f GB/s while busy, "
                "%.2f GB/s over the run%s, %.1f requests in flight on average while busy, "
                "latency p50 %.0f us p99 %.0f us\n",
                d, io_backend_name(io), io_drive_depth(io, d), store_fmt_bytes((double)io_drive_chunk(io, d), h2, 32),
                store_fmt_bytes(ds.bytes, h1, 32), (unsigned long long)ds.reqs,
                ds.busy_s > 0 ? ds.bytes / 1e9 / ds.busy_s : 0.0, run_gbps, vs,
                ds.busy_s > 0 ? ds.depth_s / ds.busy_s : 0.0, io_latency_pct(&ds, 0.5), io_latency_pct(&ds, 0.99));
    }
}

/* bytes the store has read so far (experts and spines) */
static uint64_t store_bytes(const store *s)
{
    store_stats st;
    store_stats_get(s, &st);
    return st.bytes_read + st.spine_bytes_read;
}

void engine_mark_decode(engine *e)
{
    if (!e->store || e->mark_t > 0)
        return;
    e->mark_t = timer_now();
    e->mark_bytes = store_bytes(e->store);
    for (int d = 0; d < store_ndrives(e->store) && d < 16; d++) {
        io_drive_stats ds;
        io_stats(store_io(e->store), d, &ds);
        e->mark_drive[d] = ds.bytes;
    }
}

void engine_report_decode(engine *e, FILE *f, int tokens)
{
    if (!e->store || e->mark_t <= 0 || tokens < 1)
        return;
    double dt = timer_now() - e->mark_t;
    char h1[32];
    fprintf(f, "[stats] decode: %s read per token (experts and spines) over %d tokens in %.3f s\n",
            store_fmt_bytes((double)(store_bytes(e->store) - e->mark_bytes) / tokens, h1, 32), tokens, dt);
    for (int d = 0; d < store_ndrives(e->store) && d < 16; d++) {
        io_drive_stats ds;
        io_stats(store_io(e->store), d, &ds);
        double gbps = dt > 0 ? (double)(ds.bytes - e->mark_drive[d]) / 1e9 / dt : 0.0;
        char vs[256];
        fprintf(f, "[stats] decode: drive %d read %.2f GB/s%s\n", d, gbps,
                drive_ratios(store_io(e->store), d, gbps, vs, sizeof vs));
    }
}
