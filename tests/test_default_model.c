/* test_default_model.c — the bundled model (models/default, trained by tools/train) is the one that was
 * exported: its tokenizer encodes the fixed prompt to the recorded ids, and `deltafin run` completes the
 * prompt greedily with the recorded 24 ids (tests/data/default_model_greedy.json, written at export time
 * after the engine matched Moonshot's code on these weights). Swapping or corrupting the weights, the
 * vocabulary or the config changes one of them. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_util.h"

/* ids printed by deltafin (space or comma separated) -> ids[], returns the count */
static int parse_ids(const char *s, int *ids, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) {
            s++;
            continue;
        }
        ids[n++] = (int)v;
        s = end;
    }
    return n;
}

static int same_ids(const int *got, int n, const json_t *want, char *why, size_t cap)
{
    if ((size_t)n != json_array_size(want)) {
        snprintf(why, cap, "%d ids, the record has %zu", n, json_array_size(want));
        return 0;
    }
    for (int i = 0; i < n; i++) {
        json_int_t w = json_integer_value(json_array_get(want, (size_t)i));
        if (got[i] != w) {
            snprintf(why, cap, "id %d is %d, the record has %lld", i, got[i], (long long)w);
            return 0;
        }
    }
    return 1;
}

TEST(default_model_greedy_is_recorded)
{
    json_error_t je;
    json_t *rec = json_load_file(test_data("default_model_greedy.json"), 0, &je);
    CHECKF(rec, "default_model_greedy.json: %s (line %d)", je.text, je.line);
    const char *prompt = json_string_value(json_object_get(rec, "prompt"));
    const json_t *pids = json_object_get(rec, "prompt_ids"), *greedy = json_object_get(rec, "greedy_ids");
    json_int_t max_new = json_integer_value(json_object_get(rec, "max_new"));
    if (!prompt || strchr(prompt, '\'') || !json_is_array(pids) || !json_is_array(greedy) || max_new <= 0) {
        json_decref(rec);
        CHECKF(0, "default_model_greedy.json lacks prompt / prompt_ids / greedy_ids / max_new");
    }
    char cmd[4096], out[8192], why[128];
    int ids[256];

    snprintf(cmd, sizeof cmd, "printf '%%s' '%s' | %s tokenize --model models/default", prompt, tu_bin());
    int st = tu_run(cmd, out, sizeof out);
    int n = parse_ids(out, ids, 256);
    int ok = st == 0 && same_ids(ids, n, pids, why, sizeof why);
    if (!ok) {
        json_decref(rec);
        CHECKF(0, "the bundled tokenizer encodes the prompt differently (status %d: %s): %s", st, why, out);
    }

    snprintf(cmd, sizeof cmd, "%s run --model models/default --prompt '%s' --max-new %lld --print-ids", tu_bin(),
             prompt, (long long)max_new);
    st = tu_run(cmd, out, sizeof out);
    n = parse_ids(out, ids, 256);
    ok = st == 0 && same_ids(ids, n, greedy, why, sizeof why);
    json_decref(rec);
    CHECKF(ok, "models/default no longer completes the recorded prompt as recorded at export (status %d: %s): %s",
           st, why, out);
}

/* `run --chat` on K3's format: the reply's markup (<|open|>TAG<|sep|>, <|close|>TAG<|sep|>) is
 * not printed as text; the thinking channel shows as <think>...</think>. The same ids decoded
 * plainly do show the tag names, so the check can fail. */
TEST(default_model_chat_hides_markup)
{
    char cmd[4096], ids_out[8192], text[8192], raw[8192];
    const char *q = "--model models/default --prompt 'write a function that adds two numbers' --chat --max-new 24";
    snprintf(cmd, sizeof cmd, "%s run %s --print-ids", tu_bin(), q);
    CHECKF(tu_run(cmd, ids_out, sizeof ids_out) == 0, "%s", ids_out);
    snprintf(cmd, sizeof cmd, "%s run %s", tu_bin(), q);
    CHECKF(tu_run(cmd, text, sizeof text) == 0, "%s", text);
    char path[4200];
    snprintf(path, sizeof path, "%s/chat_ids.txt", test_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs(ids_out, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s tokenize --model models/default --decode --skip-special %s", tu_bin(), path);
    CHECKF(tu_run(cmd, raw, sizeof raw) == 0, "%s", raw);
    /* the recorded model closes its thinking at once and opens the response channel */
    CHECKF(strstr(raw, "think") && strstr(raw, "response"), "plain decode: %s", raw);
    CHECKF(!strncmp(text, "<think>", 7) && strstr(text, "</think>") && !strstr(text, "response"), "run --chat: %s",
           text);
}
