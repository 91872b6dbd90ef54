/* cli.c — see cli.h. */
#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/timer.h"
#include "engine/session.h"
#include "store/store.h"

int cli_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != 0)
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *val = argv[++*i];
    return 1;
}

int cli_long(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi)
        return cli_usage(cmd, "%s expects an integer in %ld..%ld, got '%s'", opt, lo, hi, val);
    *out = v;
    return 0;
}

int cli_double(const char *cmd, const char *opt, const char *val, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !(v >= lo && v <= hi))
        return cli_usage(cmd, "%s expects a number in %g..%g, got '%s'", opt, lo, hi, val);
    *out = v;
    return 0;
}

int cli_parse_ids(const char *s, int32_t **ids, int *n, errbuf *err)
{
    size_t cap = 16;
    int cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    const char *p = s;
    while (v) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return errbuf_set(err, "token list: '%.20s' at character %d is not a token id", p, (int)(p - s));
        }
        if ((size_t)cnt == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, cap * sizeof *v);
            if (!nv)
                free(v);
            v = nv;
            if (!v)
                break;
        }
        v[cnt++] = (int32_t)x;
        p = end;
    }
    if (!v)
        return errbuf_set(err, "token list: out of memory");
    *ids = v;
    *n = cnt;
    return 0;
}

int cli_default_model(char *out, size_t cap, errbuf *err)
{
    const char *env = getenv("DELTAFIN_MODEL");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = 0;
        static const char *rel[] = {"models/default", "../models/default", "../../models/default"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(out, cap, "%s/%s", exe, rel[i]);
            if (file_is_dir(out))
                return 0;
        }
    }
    if (file_is_dir("models/default")) {
        snprintf(out, cap, "models/default");
        return 0;
    }
    return errbuf_set(err, "no --model given and the bundled model (models/default) was not found");
}


const char *CLI_STORE_HELP =
    "weight store: [--ram-budget BYTES] [--drives DIR,...] [--emulate-drives MBps:lat_us,...]\n"
    "              [--prefetch on|off] [--io uring|pread] [--no-verify]\n"
    "  --model takes a Hugging Face folder or a DFSP store (deltafin prepare). --ram-budget (e.g. 8G)\n"
    "  bounds the RAM for weights: the globals and as many layer spines as fit stay resident, the\n"
    "  other layers' spines stream through two slots, experts through a cache of what is left.\n"
    "  Without it, everything stays mapped when it fits in 80% of physical memory.\n";

void cli_store_opts_default(cli_store_opts *o)
{
    memset(o, 0, sizeof *o);
    o->prefetch = 1;
    o->verify = 1;
}

int cli_store_opt(const char *cmd, int argc, char **argv, int *i, cli_store_opts *o)
{
    const char *v;
    int r;
    if (!strcmp(argv[*i], "--no-verify")) {
        o->verify = 0;
        return 1;
    }
    static const char *const names[] = {"--ram-budget", "--drives", "--emulate-drives", "--prefetch", "--io"};
    int which = -1;
    for (int k = 0; k < (int)(sizeof names / sizeof names[0]) && which < 0; k++)
        if ((r = cli_opt(argc, argv, i, names[k], &v)) != 0)
            which = k;
    if (which >= 0) {
        if (r < 0) {
            cli_usage(cmd, "%s needs a value", names[which]);
            return -1;
        }
        uint64_t bytes;
        switch (which) {
        case 0:
            if (store_parse_bytes(v, &bytes) != 0) {
                cli_usage(cmd, "--ram-budget expects bytes like 8G or 512M, got '%s'", v);
                return -1;
            }
            o->ram_budget = v;
            break;
        case 1: o->drives = v; break;
        case 2: o->emulate = v; break;
        case 3:
            if (strcmp(v, "on") && strcmp(v, "off")) {
                cli_usage(cmd, "--prefetch expects on or off, got '%s'", v);
                return -1;
            }
            o->prefetch = !strcmp(v, "on");
            break;
        default:
            if (strcmp(v, "uring") && strcmp(v, "pread")) {
                cli_usage(cmd, "--io expects uring or pread, got '%s'", v);
                return -1;
            }
            o->io = v;
        }
        return 1;
    }
    return 0;
}

/* Replaces the drive folder of every pack with the matching --drives entry. */
static int override_drives(dfsp_info *info, const char *drives, errbuf *err)
{
    char buf[4096], *save = NULL;
    snprintf(buf, sizeof buf, "%s", drives);
    char *dir[STORE_MAX_PACKS];
    int n = 0;
    for (char *t = strtok_r(buf, ",", &save); t && n < STORE_MAX_PACKS; t = strtok_r(NULL, ",", &save))
        dir[n++] = t;
    if (n != info->ndrives)
        return errbuf_set(err, "--drives names %d folders, the store was prepared on %d", n, info->ndrives);
    for (int i = 0; i < info->npacks; i++) {
        const char *base = strrchr(info->pack_path[i], '/');
        char np[1024];
        snprintf(np, sizeof np, "%s/%s", dir[info->pack_drive[i]], base ? base + 1 : info->pack_path[i]);
        snprintf(info->pack_path[i], sizeof info->pack_path[i], "%s", np);
    }
    return 0;
}

int cli_engine_open(cli_engine *e, const char *model_dir, int threads, const char *kernels, const cli_store_opts *so,
                    errbuf *err)
{
    memset(e, 0, sizeof *e);
    char dir[4096];
    cli_store_opts dflt;
    if (!so) {
        cli_store_opts_default(&dflt);
        so = &dflt;
    }
    if (!model_dir) {
        if (cli_default_model(dir, sizeof dir, err) != 0)
            return -1;
        model_dir = dir;
    }
    e->k = kern_select(kernels);
    if (!e->k)
        return errbuf_set(err, "--kernels %s: not available on this CPU or build", kernels);
    blob_table bt;
    dfsp_info *info = calloc(1, sizeof *info);
    memset(&bt, 0, sizeof bt);
    if (!info)
        return errbuf_set(err, "out of memory");
    e->dfsp = dfsp_is_store(model_dir);
    if (e->dfsp) {
        if (dfsp_open(model_dir, &e->m, &bt, info, err) != 0) {
            free(info);
            return -1;
        }
        e->spine_int8 = info->spine_int8;
        if (so->drives && override_drives(info, so->drives, err) != 0)
            goto fail;
    } else if (model_load(&e->m, model_dir, err) != 0) {
        free(info);
        return -1;
    } else if (so->drives) {
        errbuf_set(err, "--drives applies to a DFSP store (deltafin prepare), not to a Hugging Face folder");
        goto fail;
    }
    /* stream the experts when asked to, or when the model does not fit in 80% of RAM */
    uint64_t budget = 0, ram = store_physical_ram();
    if (!bt.n && blob_table_build(&bt, &e->m, err) != 0)
        goto fail;
    int stream = so->ram_budget != NULL || so->min_cache || (ram && bt.spine_bytes + bt.expert_bytes > ram / 10 * 8);
    if (so->min_cache)
        budget = bt.spine_bytes + 2 * blob_padded(bt.max_expert);
    else if (so->ram_budget)
        store_parse_bytes(so->ram_budget, &budget);
    else
        budget = ram / 10 * 8;
    if (stream && bt.expert_bytes > 0) {
        store_cfg sc;
        memset(&sc, 0, sizeof sc);
        io_cfg_default(&sc.io);
        sc.ram_budget = budget;
        sc.prefetch = so->prefetch;
        sc.verify = so->verify;
        if (so->io)
            sc.io.backend = !strcmp(so->io, "uring") ? IO_URING : IO_PREAD;
        if (so->emulate && io_parse_emulation(&sc.io, so->emulate, err) != 0)
            goto fail;
        char heat[4200];
        if (e->dfsp) {
            snprintf(heat, sizeof heat, "%s/heat.bin", model_dir);
            sc.heat_path = heat;
        }
        if (store_open(&e->store, &e->m, &bt, e->dfsp ? info : NULL, &sc, err) != 0)
            goto fail;
    } else if (so->emulate || so->ram_budget) {
        /* nothing streams (no experts): the store options have nothing to act on */
    }
    blob_table_free(&bt);
    free(info);
    e->pool = pool_new(threads > 0 ? threads : pool_ncpu(), err);
    if (!e->pool) {
        cli_engine_close(e);
        return -1;
    }
    return 0;
fail:
    blob_table_free(&bt);
    free(info);
    model_free(&e->m);
    return -1;
}

void cli_engine_close(cli_engine *e)
{
    errbuf err;
    if (e->store && store_heat_save(e->store, &err) != 0)
        fprintf(stderr, "deltafin: could not keep routing counts: %s\n", err.msg);
    store_stats st = {0};
    if (e->store)
        store_stats_get(e->store, &st);
    if (st.copy_failures > 0) /* the run was right, from the mirrors; a copy wants repair */
        fprintf(stderr,
                "deltafin: warning: %llu reads failed or mismatched their checksum and were read from another copy; "
                "`deltafin doctor --model %s` names the bad copies\n",
                (unsigned long long)st.copy_failures, e->m.dir);
    store_free(e->store);
    pool_free(e->pool);
    if (e->m.L)
        model_free(&e->m);
    memset(e, 0, sizeof *e);
}

void cli_engine_attach(cli_engine *e, struct session *s)
{
    session_set_weights(s, e->store ? store_weights(e->store) : NULL);
}

/* " (Q of doctor's D GB/s) (P of the C GB/s doctor read the store's pack at)": drive d's read rate
 * against the drive's measured bests (the ratio), each part when doctor measured it */
static const char *drive_ratios(io_engine *io, int d, double gbps, char *buf, size_t cap)
{
    double doc = io_drive_best_gbps(io, d), cold = io_drive_cold_gbps(io, d), emu = io_drive_emulated_gbps(io, d);
    int n = 0;
    buf[0] = 0;
    if (emu > 0) { /* the emulation sets the pace: doctor's figures are the real disk's under it */
        snprintf(buf, cap, " (%.2f of its emulated %.2f GB/s)", gbps / emu, emu);
        return buf;
    }
    if (doc > 0)
        n = snprintf(buf, cap, " (%.2f of doctor's %.2f GB/s)", gbps / doc, doc);
    if (cold > 0 && n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " (%.2f of the %.2f GB/s doctor read the store's pack at)", gbps / cold,
                 cold);
    return buf;
}

void cli_engine_stats(cli_engine *e, int tokens, double seconds)
{
    const char *spine = e->spine_int8 ? ", layer spines INT8 (prepare --spine int8)" : "";
    if (!e->store) {
        fprintf(stderr, "[stats] weights: all resident (mapped)%s\n", spine);
        return;
    }
    store_stats st;
    store_stats_get(e->store, &st);
    const store_plan *pl = store_plan_get(e->store);
    double tok = tokens > 0 ? tokens : 1;
    char h1[32], h2[32], h3[32], h4[32];
    fprintf(stderr,
            "[stats] store: %s, %d expert slots of %s (%s), %s resident (globals and %d of %d layer spines), "
            "prefetch %s (%s)%s\n",
            e->dfsp ? "DFSP" : "Hugging Face folder", store_slots(e->store),
            store_fmt_bytes(store_slot_bytes(e->store), h1, 32),
            store_fmt_bytes(store_slots(e->store) * (double)store_slot_bytes(e->store), h2, 32),
            store_fmt_bytes(pl->resident_bytes, h3, 32), e->m.hp.n_layers - pl->spine_streamed, e->m.hp.n_layers,
            store_weights(e->store)->prefetch ? "on" : "off", store_io_note(e->store), spine);
    if (pl->spine_streamed > 0)
        fprintf(stderr,
                "[stats] spine: %d layers streamed through %d slots of %s, %s read per token, %llu of %llu layers "
                "already in a slot, %llu read ahead (%llu used), stalled on I/O %.3f s\n",
                pl->spine_streamed, pl->spine_slots, store_fmt_bytes(pl->spine_slot_bytes, h1, 32),
                store_fmt_bytes(st.spine_bytes_read / tok, h2, 32), (unsigned long long)st.spine_hits,
                (unsigned long long)st.spine_requests, (unsigned long long)st.spine_prefetch_reads,
                (unsigned long long)st.spine_prefetch_hits, st.spine_stall_s);
    fprintf(stderr,
            "[stats] experts: %s read per token, hit rate %.1f%% (%llu/%llu), read amplification "
            "%.3f, stalled on I/O %.3f s, at most %llu read(s) of one blob per pass\n"
            "[stats] prefetch: %llu reads, %llu of them used by the layer they were for; %llu reads on "
            "demand\n",
            store_fmt_bytes(st.bytes_read / tok, h4, 32),
            st.requests ? 100.0 * (double)st.hits / (double)st.requests : 0.0, (unsigned long long)st.hits,
            (unsigned long long)st.requests, st.bytes_needed ? (double)st.bytes_read / (double)st.bytes_needed : 0.0,
            st.stall_s, (unsigned long long)st.max_reads_blob_pass, (unsigned long long)st.prefetch_reads,
            (unsigned long long)st.prefetch_hits, (unsigned long long)(st.reads - st.prefetch_reads));
    for (int d = 0; d < store_ndrives(e->store); d++) {
        io_drive_stats ds;
        io_stats(store_io(e->store), d, &ds);
        double run_gbps = seconds > 0 ? ds.bytes / 1e9 / seconds : 0.0;
        char vs[200];
        drive_ratios(store_io(e->store), d, run_gbps, vs, sizeof vs);
        fprintf(stderr,
                "[stats] drive %d (%s, depth %d x %s requests): %s in %llu reads, %.2f GB/s while busy, "
                "%.2f GB/s over the run%s, %.1f requests in flight on average while busy, "
                "latency p50 %.0f us p99 %.0f us\n",
                d, io_backend_name(store_io(e->store)), io_drive_depth(store_io(e->store), d),
                store_fmt_bytes((double)io_drive_chunk(store_io(e->store), d), h2, 32),
                store_fmt_bytes(ds.bytes, h1, 32),
                (unsigned long long)ds.reqs,
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

void cli_engine_mark(cli_engine *e)
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

void cli_engine_stats_decode(cli_engine *e, int tokens)
{
    if (!e->store || e->mark_t <= 0 || tokens < 1)
        return;
    double dt = timer_now() - e->mark_t;
    char h1[32];
    fprintf(stderr, "[stats] decode: %s read per token (experts and spines) over %d tokens in %.3f s\n",
            store_fmt_bytes((double)(store_bytes(e->store) - e->mark_bytes) / tokens, h1, 32), tokens, dt);
    for (int d = 0; d < store_ndrives(e->store) && d < 16; d++) {
        io_drive_stats ds;
        io_stats(store_io(e->store), d, &ds);
        double gbps = dt > 0 ? (double)(ds.bytes - e->mark_drive[d]) / 1e9 / dt : 0.0;
        char vs[200];
        fprintf(stderr, "[stats] decode: drive %d read %.2f GB/s%s\n", d, gbps,
                drive_ratios(store_io(e->store), d, gbps, vs, sizeof vs));
    }
}

int cli_fail(const char *cmd, const errbuf *err)
{
    fprintf(stderr, "deltafin %s: %s\n", cmd, err->msg);
    return 1;
}

int cli_usage(const char *cmd, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "deltafin %s: %s (see deltafin %s --help)\n", cmd, msg, cmd);
    return 2;
}
