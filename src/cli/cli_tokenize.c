/* cli_tokenize.c — `deltafin tokenize`: text -> ids, chat messages -> prompt ids, ids -> text.
 * The conformance interface of the tokenizers (the oracle's tok_check.py drives it): ids are
 * printed space-separated on one line. Reads FILE, or stdin when FILE is absent or "-". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "cli/cli.h"
#include "tokenizer/tok.h"

static const char *HELP =
    "usage: deltafin tokenize [--model DIR] [--special | --no-special] [--threads N] [FILE]\n"
    "       deltafin tokenize [--model DIR] --chat MESSAGES.json [--no-thinking] [--thinking-effort E]\n"
    "                         [--no-generation-prompt] [--render]\n"
    "       deltafin tokenize [--model DIR] --decode [--skip-special] [FILE]\n"
    "Text from FILE (or stdin) -> token ids, space-separated. Without --special, special-token\n"
    "strings in the text follow the format's reference library (tiktoken: plain text; tokenizer.json:\n"
    "added tokens); --special makes every one a special id, --no-special none.\n"
    "--chat renders an OpenAI-style messages array (or a request object with messages and tools) in\n"
    "the model's chat format, including the generation prompt; --render prints the text instead.\n"
    "--decode reads ids (space or comma separated) and prints the text.\n";

static int read_input(const char *path, char **buf, size_t *len, errbuf *err)
{
    if (path && strcmp(path, "-"))
        return file_read_all(path, buf, len, err);
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        size_t r = fread(b + n, 1, cap - n, stdin);
        n += r;
        if (r == 0)
            break;
        if (n == cap) {
            char *nb = realloc(b, 2 * cap + 1);
            if (!nb)
                free(b);
            b = nb;
            cap *= 2;
        }
    }
    if (!b)
        return errbuf_set(err, "stdin: out of memory");
    if (ferror(stdin)) {
        free(b);
        return errbuf_set(err, "stdin: read error");
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

static int print_ids(const tok_ids *ids)
{
    for (size_t i = 0; i < ids->n; i++)
        printf(i ? " %d" : "%d", ids->v[i]);
    putchar('\n');
    return fflush(stdout) ? 1 : 0;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *cmd = "tokenize", *model_dir = NULL, *chat = NULL, *effort = NULL, *file = NULL, *v;
    int special = TOK_SPECIAL_DEFAULT, decode = 0, skip = 0, render = 0, thinking = 1, genprompt = 1;
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--special")) {
            special = TOK_SPECIAL_ALL;
        } else if (!strcmp(argv[i], "--no-special")) {
            special = TOK_SPECIAL_NONE;
        } else if (!strcmp(argv[i], "--decode")) {
            decode = 1;
        } else if (!strcmp(argv[i], "--skip-special")) {
            skip = 1;
        } else if (!strcmp(argv[i], "--render")) {
            render = 1;
        } else if (!strcmp(argv[i], "--no-thinking")) {
            thinking = 0;
        } else if (!strcmp(argv[i], "--no-generation-prompt")) {
            genprompt = 0;
        } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
            model_dir = v;
        } else if ((r = cli_opt(argc, argv, &i, "--chat", &v))) {
            chat = v;
        } else if ((r = cli_opt(argc, argv, &i, "--thinking-effort", &v))) {
            effort = v;
        } else if ((r = cli_opt(argc, argv, &i, "--threads", &v))) {
            if (r > 0 && cli_long(cmd, "--threads", v, 1, 1024, &threads))
                return 2;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        } else if (!file) {
            file = argv[i];
        } else {
            return cli_usage(cmd, "more than one input file ('%s')", argv[i]);
        }
        if (r < 0)
            return cli_usage(cmd, "%s needs a value", argv[i]);
    }
    if (chat && (decode || file))
        return cli_usage(cmd, "--chat takes its messages from the file it names; no other input");
    errbuf err = {{0}};
    char dir[4096], *in = NULL, *text = NULL;
    size_t inlen = 0;
    tok *t = NULL;
    tok_ids ids = {0};
    json_t *req = NULL;
    pool *p = NULL;
    int rc = 1;
    if (!model_dir) {
        if (engine_default_model(dir, sizeof dir, &err))
            return cli_fail(cmd, &err);
        model_dir = dir;
    }
    if (tok_load(&t, model_dir, &err))
        goto out;
    if (chat) {
        tok_chat_opts o;
        tok_chat_opts_init(&o);
        o.thinking = thinking;
        o.thinking_effort = effort;
        o.add_generation_prompt = genprompt;
        if (!(req = jsonr_load_file(chat, &err)))
            goto out;
        if (render) {
            size_t n;
            if (tok_chat_render(t, req, &o, &text, &n, &err))
                goto out;
            fwrite(text, 1, n, stdout);
            rc = fflush(stdout) ? 1 : 0;
            goto out;
        }
        if (tok_chat_encode(t, req, &o, &ids, &err))
            goto out;
        rc = print_ids(&ids);
        goto out;
    }
    if (read_input(file, &in, &inlen, &err))
        goto out;
    if (decode) {
        int32_t *v = NULL;
        int n = 0;
        size_t tl;
        if (cli_parse_ids(in, &v, &n, &err))
            goto out;
        int drc = tok_decode(t, v, (size_t)n, skip, &text, &tl, &err);
        free(v);
        if (drc)
            goto out;
        fwrite(text, 1, tl, stdout);
        rc = fflush(stdout) ? 1 : 0;
        goto out;
    }
    if (!(p = pool_new(threads > 0 ? (int)threads : pool_ncpu(), &err)))
        goto out;
    if (tok_encode_parallel(t, in, inlen, (tok_special)special, p, &ids, &err))
        goto out;
    rc = print_ids(&ids);
out:
    if (rc == 1 && err.msg[0])
        cli_fail(cmd, &err);
    pool_free(p);
    json_decref(req);
    tok_ids_free(&ids);
    free(text);
    free(in);
    tok_free(t);
    return rc;
}
