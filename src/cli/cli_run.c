/* cli_run.c — `deltafin run`: generate from a prompt, streaming each token as it is decided. */
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "cli/cli.h"
#include "engine/generate.h"
#include "tokenizer/tok.h"

static const char *HELP =
    "usage: deltafin run [model options] (--prompt TEXT | --tokens 1,2,3) [--chat] [--system TEXT]\n"
    "                    [--no-thinking] [--thinking-effort low|high|max] [--max-new N] [--temperature T]\n"
    "                    [--top-p P] [--top-k K] [--min-p P] [--seed S] [--prefill-chunk N]\n"
    "                    [--print-ids] [--ignore-eos] [--stop-eos] [--stats]\n"
    "                    [drafting options]\n"
    "Without --model the bundled default model is used. Temperature 0 (the default) is greedy.\n"
    "--prompt is encoded with the model's tokenizer (text typed there never becomes special tokens);\n"
    "--chat renders it as a user message in the model's chat format and stops at the end of the\n"
    "reply. Text modes stop at end-of-text/end-of-message ids unless --ignore-eos.\n"
    "--tokens is the raw interface: it generates exactly --max-new ids unless --stop-eos.\n"
    "Output is text, or the generated ids with --print-ids. --stats prints time to first token,\n"
    "tokens/s, per-phase times and weight-store figures on stderr.\n";

/* Where generated ids go: printed as ids, decoded as plain text (tok_stream), or with --chat read
 * by the reply parser (tok_reply): reasoning shows as <think>...</think>, a tool call as a line
 * "[tool call] NAME ARGUMENTS", the markup itself not at all. */
struct emit {
    int print_ids;
    int n;
    engine *eng;      /* marked at the first token: --stats reports decode apart from the prompt */
    tok_stream *ts;   /* plain text, or NULL */
    tok_reply *reply; /* --chat, or NULL */
    int in_think;     /* "<think>" printed and not yet closed */
};

static int on_reply(void *ud, const tok_reply_event *ev)
{
    struct emit *e = ud;
    if (ev->kind == TOK_REPLY_REASONING && !e->in_think) {
        fputs("<think>", stdout);
        e->in_think = 1;
    } else if (ev->kind != TOK_REPLY_REASONING && e->in_think) {
        fputs("</think>\n", stdout);
        e->in_think = 0;
    }
    if (ev->kind == TOK_REPLY_TEXT || ev->kind == TOK_REPLY_REASONING)
        fwrite(ev->text, 1, ev->len, stdout);
    else if (ev->kind == TOK_REPLY_TOOL_CALL)
        printf("\n[tool call] %s %.*s\n", ev->name, (int)ev->len, ev->text);
    return 0;
}

static int on_token(void *ud, int32_t id)
{
    struct emit *e = ud;
    errbuf err;
    if (e->n == 0)
        engine_mark_decode(e->eng);
    if (e->print_ids || (!e->ts && !e->reply)) {
        printf(e->n++ ? " %d" : "%d", id);
    } else if (e->reply) {
        e->n++;
        if (tok_reply_feed(e->reply, &id, 1, on_reply, e, &err) < 0)
            fprintf(stderr, "deltafin run: %s\n", err.msg);
    } else {
        e->n++;
        size_t n;
        const char *txt = tok_stream_feed(e->ts, id, &n);
        fwrite(txt, 1, n, stdout);
    }
    fflush(stdout);
    return 0;
}

static void report_drafting(const gen_stats *st)
{
    for (int d = 0; d < st->n_drafters; d++) {
        const gen_draft_stats *x = &st->draft[d];
        fprintf(stderr,
                "[stats] draft %s: %llu steps, %llu drafted, %llu accepted, %.2f accepted per step (%.2f tokens per "
                "pass), %.3f s proposing, %llu guesses ruled on unverified; kept by position:",
                x->name, (unsigned long long)x->steps, (unsigned long long)x->proposed,
                (unsigned long long)x->accepted, x->steps ? (double)x->accepted / (double)x->steps : 0.0,
                x->steps ? (double)(x->accepted + x->steps) / (double)x->steps : 0.0, x->propose_s,
                (unsigned long long)x->ruled_unverified);
        for (int j = 0; j < GEN_MAX_DRAFT && x->by_pos_tried[j]; j++)
            fprintf(stderr, " %.2f", (double)x->by_pos_kept[j] / (double)x->by_pos_tried[j]);
        fprintf(stderr, "\n");
    }
    if (st->passes)
        fprintf(stderr, "[stats] decode: %llu passes for %d tokens (%.2f per pass); the economics predicted %.3f s of "
                        "passes, they took %.3f s\n",
                (unsigned long long)st->passes, st->n_gen, (double)st->n_gen / (double)st->passes, st->predicted_s,
                st->measured_s);
}

int cmd_run(int argc, char **argv)
{
    const char *cmd = "run", *tokens = NULL, *prompt = NULL, *system = NULL, *effort = NULL, *v;
    long max_new = 64, chunk = 0, top_k = 0, seed = 0;
    double temp = 0.0, top_p = 1.0, min_p = 0.0;
    int print_ids = 0, stats = 0, stop_eos = 0, ignore_eos = 0, chat = 0, thinking = 1;
    engine_opts eo;
    engine_opts_default(&eo);
    draft_opts dopt;
    draft_opts_default(&dopt);
    for (int i = 1; i < argc; i++) {
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            fputs(ENGINE_OPTS_HELP, stdout);
            fputs(DRAFT_OPTS_HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--print-ids")) {
            print_ids = 1;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = 1;
        } else if (!strcmp(argv[i], "--stop-eos")) {
            stop_eos = 1;
        } else if (!strcmp(argv[i], "--ignore-eos")) {
            ignore_eos = 1;
        } else if (!strcmp(argv[i], "--chat")) {
            chat = 1;
        } else if (!strcmp(argv[i], "--no-thinking")) {
            thinking = 0;
        } else if ((r = cli_engine_opt(cmd, argc, argv, &i, &eo))) {
            if (r < 0)
                return 2;
            continue;
        } else if ((r = cli_opt(argc, argv, &i, "--tokens", &v))) {
            tokens = v;
        } else if ((r = cli_opt(argc, argv, &i, "--prompt", &v))) {
            prompt = v;
        } else if ((r = cli_opt(argc, argv, &i, "--system", &v))) {
            system = v;
        } else if ((r = cli_opt(argc, argv, &i, "--thinking-effort", &v))) {
            effort = v;
        } else if ((r = cli_draft_opt(cmd, argc, argv, &i, &dopt))) {
            if (r < 0)
                return 2;
            continue;
        } else if ((r = cli_opt(argc, argv, &i, "--max-new", &v))) {
            if (r > 0 && cli_long(cmd, "--max-new", v, 0, 1 << 30, &max_new))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--prefill-chunk", &v))) {
            if (r > 0 && cli_long(cmd, "--prefill-chunk", v, 1, 1 << 20, &chunk))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--top-k", &v))) {
            if (r > 0 && cli_long(cmd, "--top-k", v, 0, 1 << 30, &top_k))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--seed", &v))) {
            if (r > 0 && cli_long(cmd, "--seed", v, 0, 0x7fffffffffffffffL, &seed))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--temperature", &v))) {
            if (r > 0 && cli_double(cmd, "--temperature", v, 0.0, 100.0, &temp))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--top-p", &v))) {
            if (r > 0 && cli_double(cmd, "--top-p", v, 1e-9, 1.0, &top_p))
                return 2;
        } else if ((r = cli_opt(argc, argv, &i, "--min-p", &v))) {
            if (r > 0 && cli_double(cmd, "--min-p", v, 0.0, 1.0, &min_p))
                return 2;
        } else {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        }
        if (r < 0)
            return cli_usage(cmd, "%s needs a value", argv[i]);
    }
    if (!tokens == !prompt)
        return cli_usage(cmd, "give exactly one of --prompt and --tokens");
    if (chat && !prompt)
        return cli_usage(cmd, "--chat needs --prompt");
    errbuf err;
    double t0 = timer_now();
    engine *e = NULL;
    session *s = NULL;
    sampler sm;
    const tok *tk = NULL;
    tok_stream ts;
    tok_reply *reply = NULL;
    tok_ids ids = {0};
    int rc = 1, have_stream = 0;
    int32_t *stop = NULL;
    struct emit em = {0};
    json_t *msgs = NULL;
    drafter *drafters[GEN_MAX_DRAFTERS] = {0};
    int nd = 0;
    memset(&sm, 0, sizeof sm);
    memset(&ts, 0, sizeof ts);
    cli_model pick;
    cli_model_pick(cmd, &eo, &pick);
    if (engine_open(&eo, &e, &err) != 0)
        return cli_fail(cmd, &err);
    double t_load = timer_now() - t0;
    const hparams *hp = engine_hparams(e);
    int nstop = 0;
    if (tokens) {
        int32_t *raw;
        int n;
        if (cli_parse_ids(tokens, &raw, &n, &err) != 0)
            goto out;
        for (int i = 0; i < n; i++)
            tok_ids_push(&ids, raw[i]);
        free(raw);
        if (ids.n == 0) {
            engine_free(e);
            tok_ids_free(&ids);
            return cli_usage(cmd, "--tokens is empty");
        }
    }
    if (prompt || !print_ids) { /* text needs the tokenizer; ids alone do not */
        if (!(tk = engine_tok(e, &err)) && prompt)
            goto out; /* --tokens without a tokenizer: print ids */
    }
    if (prompt) {
        if (chat) {
            msgs = json_array();
            if (system)
                json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
            json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
            tok_chat_opts co;
            tok_chat_opts_init(&co);
            co.thinking = thinking;
            co.thinking_effort = effort;
            if (tok_chat_encode(tk, msgs, &co, &ids, &err) != 0)
                goto out;
        } else if (tok_encode(tk, prompt, strlen(prompt), TOK_SPECIAL_NONE, &ids, &err) != 0) {
            goto out;
        }
        if (ids.n == 0) {
            errbuf_set(&err, "the prompt encodes to no tokens");
            goto out;
        }
    }
    /* stop ids: text modes stop at the model's and the chat format's end ids */
    if ((prompt && !ignore_eos) || stop_eos) {
        const int32_t *ts_ids = NULL;
        int nt = tk ? tok_stop_ids(tk, &ts_ids) : 0;
        stop = malloc(sizeof(int32_t) * (size_t)(hp->n_eos + nt + 1));
        if (!stop) {
            errbuf_set(&err, "out of memory");
            goto out;
        }
        for (int i = 0; i < hp->n_eos; i++)
            stop[nstop++] = hp->eos_ids[i];
        for (int i = 0; i < nt; i++)
            stop[nstop++] = ts_ids[i];
    }
    if (tk && !print_ids && chat) {
        if (tok_reply_new(tk, thinking, &reply, &err) != 0)
            goto out;
    } else if (tk && !print_ids) {
        if (tok_stream_init(&ts, tk, 1, &err) != 0)
            goto out;
        have_stream = 1;
    }
    sampler_cfg sc;
    sampler_cfg_default(&sc);
    sc.temperature = (float)temp;
    sc.top_k = (int)top_k;
    sc.top_p = (float)top_p;
    sc.min_p = (float)min_p;
    sc.seed = (uint64_t)seed;
    int n = (int)ids.n;
    session_opts so;
    session_opts_default(&so);
    so.context = n + (int)max_new;
    if (hp->ctx_len > 0 && so.context > hp->ctx_len)
        so.context = hp->ctx_len; /* as session_new would: the model's positions */
    so.max_pass = chunk > 0 ? (int)chunk : (n < 256 ? n : 256);
    so.prefill_chunk = chunk > 0 ? (int)chunk : 0; /* a verify pass may be longer than the prompt's passes */
    so.ckpt_budget = 0; /* one prompt, nothing to come back to */
    draft_ctx dc = {.target = e, .context = so.context, .messages = msgs, .thinking = thinking};
    if (draft_open(&dopt, &dc, drafters, &nd, &err) != 0)
        goto out;
    so.max_logits = nd ? dopt.max + 1 : 1; /* a verify pass: logits of all its positions, kept in part */
    so.max_commit = nd ? dopt.max + 1 : 0;
    if (so.max_pass < so.max_logits)
        so.max_pass = so.max_logits;
    gen_req rq = {.prompt = ids.v, .n_prompt = n, .max_new = (int)max_new, .stop = stop, .n_stop = nstop,
                  .drafters = drafters, .n_drafters = nd, .draft_max = dopt.max};
    em = (struct emit){print_ids, 0, e, have_stream ? &ts : NULL, reply, 0};
    if (reply && thinking && tok_chat_format_of(tk) == TOK_CHAT_K3) {
        fputs("<think>", stdout); /* the prompt opened the thinking channel */
        em.in_think = 1;
    }
    gen_stats st;
    if (sampler_init(&sm, &sc, hp->vocab, &err) || session_new(e, &so, &s, &err))
        goto out;
    for (int d = 0; d < nd; d++)
        if (drafters[d]->n_taps > 0 &&
            session_set_tap_sink(s, drafters[d]->taps, drafters[d]->n_taps, drafters[d]->on_taps, drafters[d], &err))
            goto out;
    if (gen_run(s, &sm, &rq, on_token, NULL, &em, &st, &err) != 0)
        goto out;
    if (have_stream) {
        size_t len;
        const char *rest = tok_stream_flush(&ts, &len);
        fwrite(rest, 1, len, stdout);
    }
    if (reply && tok_reply_finish(reply, on_reply, &em, &err) < 0)
        goto out;
    if (em.in_think)
        fputs("</think>", stdout);
    printf("\n");
    fflush(stdout);
    if (stats) {
        char what[256];
        engine_describe(e, what, sizeof what);
        fprintf(stderr,
                "[stats] %s\n"
                "[stats] load %.3f s | prompt %d tokens in %.3f s (%.1f tok/s) | time to first token %.3f s\n"
                "[stats] generated %d tokens, decode %.2f tok/s (%.3f s for %d after the first)\n",
                what, t_load, st.n_prompt, st.t_prefill, st.t_prefill > 0 ? st.n_prompt / st.t_prefill : 0.0,
                st.t_first, st.n_gen, st.t_decode > 0 && st.n_gen > 1 ? (st.n_gen - 1) / st.t_decode : 0.0,
                st.t_decode, st.n_gen - 1);
        engine_report(e, stderr, st.n_prompt + st.n_gen, st.t_prefill + st.t_decode);
        engine_report_decode(e, stderr, st.n_gen - 1);
        report_drafting(&st);
    }
    rc = 0;
out:
    if (rc && em.n > 0) { /* what was produced stays, on its own line before the error */
        printf("\n");
        fflush(stdout);
    }
    if (rc)
        cli_fail(cmd, &err);
    free(stop);
    sampler_free(&sm);
    session_free(s);
    if (have_stream)
        tok_stream_free(&ts);
    tok_reply_free(reply);
    draft_close(drafters, nd);
    json_decref(msgs);
    tok_ids_free(&ids);
    engine_free(e);
    return rc;
}
