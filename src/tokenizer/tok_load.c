/* tok_load.c — opening a model folder's tokenizer and deciding its chat format and stop ids.
 *
 * Which vocabulary: tiktoken.model (Kimi, or a plain encoding with tiktoken_config.json) wins over
 * tokenizer.json. Which chat format, in order: config.json model_type "kimi_k3" -> K3 XTML (K3
 * ships no chat template); otherwise the chat template's markers (tokenizer_config.json
 * chat_template, or chat_template.jinja): <|im_middle|> -> Kimi K2, <|im_start|> -> Qwen3 ChatML,
 * <｜Assistant｜> -> DeepSeek-V3; otherwise the special tokens present (<|open|> <|sep|>
 * <|end_of_msg|> -> K3, <|im_middle|> -> Kimi K2). Stop ids: the format's end of message first,
 * then its end-of-text token, then config.json's eos_token_id(s).
 */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/jsonr.h"
#include "tokenizer/tok_int.h"

void tok_free(tok *t)
{
    if (!t)
        return;
    free(t->blob);
    free(t->off);
    free(t->kind);
    free(t->pair2);
    tok_smap_free(&t->bytes);
    tok_smap_free(&t->spec);
    tok_pmap_free(&t->merges);
    tok_pretok_free(&t->pt);
    free(t);
}

int tok_vocab_size(const tok *t) { return t->nids; }
tok_chat_format tok_chat_format_of(const tok *t) { return t->chat; }

const char *tok_chat_format_name(tok_chat_format f)
{
    static const char *names[] = {"none", "kimi-k3", "kimi-k2", "qwen3", "deepseek-v3"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

int32_t tok_token_id(const tok *t, const char *s, size_t len)
{
    int32_t id = tok_smap_get(&t->spec, t, (const uint8_t *)s, len);
    return id >= 0 ? id : tok_smap_get(&t->bytes, t, (const uint8_t *)s, len);
}

const uint8_t *tok_token_bytes(const tok *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->nids || t->kind[id] == TK_UNUSED)
        return NULL;
    *len = (size_t)(t->off[id + 1] - t->off[id]);
    return t->blob + t->off[id];
}

int tok_is_special(const tok *t, int32_t id)
{
    return id >= 0 && id < t->nids && (t->kind[id] == TK_SPECIAL || t->kind[id] == TK_ADDED);
}

int tok_stop_ids(const tok *t, const int32_t **ids)
{
    *ids = t->stops;
    return t->nstops;
}

int tok_is_stop(const tok *t, int32_t id)
{
    for (int i = 0; i < t->nstops; i++)
        if (t->stops[i] == id)
            return 1;
    return 0;
}

int32_t tok_eom_id(const tok *t) { return t->eom; }

static int32_t named(const tok *t, const char *s) { return tok_smap_get(&t->spec, t, (const uint8_t *)s, strlen(s)); }

static void add_stop(tok *t, int32_t id)
{
    if (id < 0 || id >= t->nids || t->kind[id] == TK_UNUSED || t->nstops == (int)(sizeof t->stops / sizeof t->stops[0]))
        return;
    for (int i = 0; i < t->nstops; i++)
        if (t->stops[i] == id)
            return;
    t->stops[t->nstops++] = id;
}

static void add_eos(tok *t, const json_t *v)
{
    size_t i;
    json_t *x;
    if (json_is_integer(v))
        add_stop(t, (int32_t)json_integer_value(v));
    else
        json_array_foreach(v, i, x) if (json_is_integer(x)) add_stop(t, (int32_t)json_integer_value(x));
}

int tok_finish(tok *t, const json_t *cfg, const json_t *tcfg, const char *jinja, errbuf *err)
{
    if (tok_specials_index(t, err))
        return -1;
    if (tok_pair2_init(t))
        return errbuf_set(err, "out of memory");
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    const json_t *ct = json_object_get(tcfg, "chat_template");
    const char *tmpl = jinja;
    if (!tmpl && json_is_string(ct))
        tmpl = json_string_value(ct);
    if (!tmpl && json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...] */
        size_t i;
        json_t *x;
        json_array_foreach(ct, i, x)
        {
            const char *nm = json_string_value(json_object_get(x, "name"));
            if (nm && !strcmp(nm, "default"))
                tmpl = json_string_value(json_object_get(x, "template"));
        }
    }
    int k3_tokens = named(t, "<|open|>") >= 0 && named(t, "<|sep|>") >= 0 && named(t, "<|end_of_msg|>") >= 0;
    if (mt && !strcmp(mt, "kimi_k3"))
        t->chat = TOK_CHAT_K3;
    else if (tmpl && strstr(tmpl, "<|im_middle|>"))
        t->chat = TOK_CHAT_KIMI2;
    else if (tmpl && strstr(tmpl, "<|im_start|>"))
        t->chat = TOK_CHAT_QWEN3;
    else if (tmpl && strstr(tmpl, "\xEF\xBD\x9C" "Assistant" "\xEF\xBD\x9C"))
        t->chat = TOK_CHAT_DEEPSEEK3;
    else if (k3_tokens)
        t->chat = TOK_CHAT_K3;
    else if (named(t, "<|im_middle|>") >= 0 && named(t, "<|im_user|>") >= 0)
        t->chat = TOK_CHAT_KIMI2;
    if (t->chat == TOK_CHAT_KIMI2 && tmpl && strstr(tmpl, "<think>"))
        t->kimi2_think = 1;
    switch (t->chat) {
    case TOK_CHAT_K3:
        t->eom = named(t, "<|end_of_msg|>");
        add_stop(t, t->eom);
        add_stop(t, named(t, "[EOS]"));
        break;
    case TOK_CHAT_KIMI2:
        t->eom = named(t, "<|im_end|>");
        add_stop(t, t->eom);
        add_stop(t, named(t, "[EOS]"));
        break;
    case TOK_CHAT_QWEN3:
        t->eom = named(t, "<|im_end|>");
        add_stop(t, t->eom);
        add_stop(t, named(t, "<|endoftext|>"));
        break;
    case TOK_CHAT_DEEPSEEK3:
        t->eom = named(t, "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>");
        add_stop(t, t->eom);
        break;
    default:
        break;
    }
    add_eos(t, json_object_get(cfg, "eos_token_id"));
    add_eos(t, json_object_get(json_object_get(cfg, "text_config"), "eos_token_id"));
    return 0;
}

tok *tok_new(void)
{
    tok *t = calloc(1, sizeof *t);
    if (t)
        t->eom = -1;
    return t;
}

int tok_load(tok **out, const char *dir, errbuf *err)
{
    char path[4096];
    json_t *cfg = NULL, *tcfg = NULL;
    char *jinja = NULL;
    size_t jlen = 0;
    int rc = -1;
    *out = NULL;
    tok *t = tok_new();
    if (!t)
        return errbuf_set(err, "out of memory");
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    if (file_exists(path)) {
        if (tok_load_tiktoken(t, dir, err))
            goto out;
    } else {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (!file_exists(path)) {
            errbuf_set(err, "%s: no tiktoken.model or tokenizer.json", dir);
            goto out;
        }
        if (tok_load_hf(t, dir, err))
            goto out;
    }
    /* the chat format: config.json, tokenizer_config.json, chat_template.jinja (all optional) */
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (file_exists(path) && !(cfg = jsonr_load_file(path, err)))
        goto out;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (file_exists(path) && !(tcfg = jsonr_load_file(path, err)))
        goto out;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (file_exists(path) && file_read_all(path, &jinja, &jlen, err))
        goto out;
    if (tok_finish(t, cfg, tcfg, jinja, err))
        goto out;
    *out = t;
    t = NULL;
    rc = 0;
out:
    tok_free(t);
    json_decref(cfg);
    json_decref(tcfg);
    free(jinja);
    return rc;
}
