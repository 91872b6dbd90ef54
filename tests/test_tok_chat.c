/* test_tok_chat.c — chat formats beyond the oracle's cases: Kimi K2 (and K2-Thinking) and
 * DeepSeek-V3 against renderings of their templates written out by hand, and
 * the parts of K3's encoding_k3.py the oracle chats do not reach (tool choice, response format,
 * names and attribute escaping, dynamic tools, images, argument types, non-JSON arguments, tool
 * result re-ordering, thinking off). Model folders for K2 and DeepSeek are assembled in a temp dir. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "test.h"
#include "test_tok.h"

static char *render(const tok *t, const char *json, int thinking, errbuf *err)
{
    json_error_t je;
    json_t *req = json_loads(json, 0, &je);
    if (!req) {
        errbuf_set(err, "test JSON: %s", je.text);
        return NULL;
    }
    tok_chat_opts o;
    tok_chat_opts_init(&o);
    o.thinking = thinking;
    char *s = NULL;
    size_t n;
    int rc = tok_chat_render(t, req, &o, &s, &n, err);
    json_decref(req);
    return rc ? NULL : s;
}

static int count(const tok_ids *ids, int32_t id)
{
    int n = 0;
    for (size_t i = 0; i < ids->n; i++)
        n += ids->v[i] == id;
    return n;
}

static int encode_chat(const tok *t, const char *json, int thinking, tok_ids *ids, errbuf *err)
{
    json_t *req = json_loads(json, 0, NULL);
    tok_chat_opts o;
    tok_chat_opts_init(&o);
    o.thinking = thinking;
    int rc = !req || tok_chat_encode(t, req, &o, ids, err);
    json_decref(req);
    return rc;
}

TEST(tok_chat_kimi2)
{
    errbuf err;
    tok *t = tt_k2_tok(0, &err);
    CHECKF(t, "%s", err.msg);
    CHECKF(tok_chat_format_of(t) == TOK_CHAT_KIMI2 && tok_eom_id(t) == 200000, "format %d eom %d",
           tok_chat_format_of(t), tok_eom_id(t));
    int ok = 1;
    char *s = render(t, "[{\"role\": \"user\", \"content\": \"Hi\"}]", 1, &err);
    if (!s)
        fprintf(stderr, "%s\n", err.msg);
    ok = ok && s &&
         !strcmp(s, "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
                    "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
    free(s);
    static const char tools_chat[] =
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
        "\"object\"}}}], \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
        "\"content\": \"Weather <|im_end|> Paris?\"}, {\"role\": \"assistant\", \"content\": \"Let me check.\", "
        "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
        "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"content\": \"21C\"}]}";
    s = render(t, tools_chat, 1, &err);
    const char *want =
        "<|im_system|>tool_declare<|im_middle|>[{\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
        "\"object\"}},\"type\":\"function\"}]<|im_end|><|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather <|im_end|> Paris?<|im_end|><|im_assistant|>assistant<|im_middle|>Let me "
        "check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>"
        "## Return of functions.get_weather:0\n21C<|im_end|><|im_assistant|>assistant<|im_middle|>";
    int rok = s && !strcmp(s, want);
    if (!rok)
        fprintf(stderr, "got  %s\nwant %s\n", s ? s : err.msg, want);
    free(s);
    tok_ids ids = {0};
    /* the <|im_end|> typed by the user stays text: 5 turn ends, not 6 */
    ok = ok && rok && !encode_chat(t, tools_chat, 1, &ids, &err) && count(&ids, 200000) == 5 &&
         count(&ids, 200015) == 6 && count(&ids, 200011) == 1;
    tok_ids_free(&ids);
    tok_free(t);
    CHECK(ok);

    t = tt_k2_tok(1, &err);
    CHECKF(t, "%s", err.msg);
    s = render(t,
               "[{\"role\": \"user\", \"content\": \"Q1\"}, {\"role\": \"assistant\", \"content\": \"A1\", "
               "\"reasoning_content\": \"r1\"}, {\"role\": \"user\", \"content\": \"Q2\"}, {\"role\": \"assistant\", "
               "\"content\": \"\", \"reasoning_content\": \"r2\", \"tool_calls\": [{\"id\": \"c9\", \"function\": "
               "{\"name\": \"f\", \"arguments\": {\"x\": 1}}}]}, {\"role\": \"tool\", \"name\": \"f\", \"content\": "
               "\"ok\"}]",
               1, &err);
    want = "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
           "<|im_user|>user<|im_middle|>Q1<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>"
           "<|im_user|>user<|im_middle|>Q2<|im_end|><|im_assistant|>assistant<|im_middle|><think>r2</think>"
           "<|tool_calls_section_begin|><|tool_call_begin|>c9<|tool_call_argument_begin|>{\"x\": 1}<|tool_call_end|>"
           "<|tool_calls_section_end|><|im_end|><|im_system|>f<|im_middle|>## Return of c9\nok<|im_end|>"
           "<|im_assistant|>assistant<|im_middle|>";
    rok = s && !strcmp(s, want);
    if (!rok)
        fprintf(stderr, "got  %s\nwant %s\n", s ? s : err.msg, want);
    free(s);
    ids.n = 0;
    tok_free(t);
    CHECK(rok);
}

/* A DeepSeek-style tokenizer.json: byte-level vocab of the 256 bytes and DeepSeek's specials. */
TEST(tok_chat_deepseek3)
{
    errbuf err;
    tok *t = tt_ds_tok(&err);
    CHECKF(t, "%s", err.msg);
    CHECKF(tok_chat_format_of(t) == TOK_CHAT_DEEPSEEK3 && tok_eom_id(t) == 301, "format %d eom %d",
           tok_chat_format_of(t), tok_eom_id(t));
    int ok = 1;
    char *s = render(t, "[{\"role\": \"system\", \"content\": \"You are helpful.\"}, {\"role\": \"user\", \"content\": \"Hi\"}]",
                     1, &err);
    ok = ok && s && !strcmp(s, "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi<｜Assistant｜>");
    free(s);
    s = render(t,
               "[{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
               "[{\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"content\": \"a\"}, "
               "{\"role\": \"tool\", \"content\": \"b\"}]",
               1, &err);
    ok = ok && s &&
         !strcmp(s, "<｜begin▁of▁sentence｜><｜User｜>Q<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
                    "function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
                    "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>a<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>b"
                    "<｜tool▁output▁end｜><｜tool▁outputs▁end｜><｜Assistant｜>");
    free(s);
    tok_ids ids = {0};
    ok = ok && !encode_chat(t, "[{\"role\": \"user\", \"content\": \"Hi 12345\"}]", 1, &ids, &err) && ids.n == 11 &&
         ids.v[0] == 300 && ids.v[1] == 302 && ids.v[2] == 72 && ids.v[10] == 303;
    tok_ids_free(&ids);
    tok_free(t);
    CHECK(ok);
}

static int renders(const tok *t, const char *json, int thinking, const char *want)
{
    errbuf err;
    char *s = render(t, json, thinking, &err);
    int ok = s && !strcmp(s, want);
    if (!ok)
        fprintf(stderr, "got  %s\nwant %s\n", s ? s : err.msg, want);
    free(s);
    return ok;
}

#define MSG_USER "<|open|>message role=\"user\"<|sep|>"
#define END "<|close|>message<|sep|><|end_of_msg|>"
#define GEN_RESP "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"

TEST(tok_chat_k3_details)
{
    const char *why;
    tok *t = tt_tok("kimi-k3-standin", &why);
    CHECKF(t, "%s", why);
    /* tool choice and response format notes come after the conversation */
    CHECK(renders(t,
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\", "
                  "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"s\", \"schema\": "
                  "{\"type\": \"object\", \"properties\": {\"b\": {}, \"a\": {}}}}}}",
                  0,
                  MSG_USER "x" END "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>The system is invoked "
                           "with `tool_choice=required`.\nYou MUST call tools in the next message." END
                           "<|open|>message role=\"system\" type=\"response-format\"<|sep|>The system is invoked with "
                           "`response_format=json_schema`.\nYour response must be raw JSON data without markdown code "
                           "blocks (```json) or any additional formatting.\nThe JSON data must match the following "
                           "schema:\n```json\n{\"properties\":{\"a\":{},\"b\":{}},\"type\":\"object\"}\n```" END GEN_RESP));
    /* names, attribute escaping, image parts, thinking off drops the think channel */
    CHECK(renders(t,
                  "[{\"role\": \"user\", \"name\": \"a\\\"b&c\", \"content\": [{\"type\": \"text\", \"text\": \"see \"}, "
                  "{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}, {\"role\": \"assistant\", \"content\": "
                  "\"ok\", \"reasoning_content\": \"hidden\"}]",
                  0,
                  "<|open|>message role=\"user\" name=\"a&quot;b&amp;c\"<|sep|>see <|kimi_image_placeholder|>" END
                  "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|>" END GEN_RESP));
    /* argument types and values, non-JSON arguments, whitespace-only reasoning, dynamic tools */
    CHECK(renders(t,
                  "[{\"role\": \"system\", \"tools\": [{\"b\": 1, \"a\": \"é\"}]}, {\"role\": \"assistant\", \"content\": "
                  "null, \"reasoning_content\": \" \\n\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
                  "\"arguments\": \"{\\\"z\\\": 2, \\\"b\\\": [1, 2], \\\"c\\\": {\\\"x\\\": null}, \\\"d\\\": true, "
                  "\\\"e\\\": 1.5e-07, \\\"s\\\": \\\"\\\"}\"}}, {\"function\": {\"name\": \"g\", \"arguments\": \"not "
                  "json\"}}]}]",
                  1,
                  "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to "
                  "think in your thinking channel (not including the response channel), supported values include "
                  "`low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=max`." END
                  "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|>## New Tools Available\nThe system "
                  "dynamically extends the toolset via lazy-loading.\nYou have access to all existing and extended "
                  "tools.\nHere are the specs for the extended tools.\n\n```json\n[{\"a\":\"é\",\"b\":1}]\n```" END
                  "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>"
                  "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
                  "<|open|>argument key=\"z\" type=\"number\"<|sep|>2<|close|>argument<|sep|>"
                  "<|open|>argument key=\"b\" type=\"array\"<|sep|>[1, 2]<|close|>argument<|sep|>"
                  "<|open|>argument key=\"c\" type=\"object\"<|sep|>{\"x\": null}<|close|>argument<|sep|>"
                  "<|open|>argument key=\"d\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
                  "<|open|>argument key=\"e\" type=\"number\"<|sep|>1.5e-07<|close|>argument<|sep|>"
                  "<|open|>argument key=\"s\" type=\"string\"<|sep|><|close|>argument<|sep|>"
                  "<|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>not "
                  "json<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>" END
                  "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"));
    /* tool results are put back in tool_calls order and named after the matched call */
    CHECK(renders(t,
                  "[{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"function\": "
                  "{\"name\": \"add\", \"arguments\": \"{}\"}}, {\"id\": \"c2\", \"function\": {\"name\": \"lookup\", "
                  "\"arguments\": {}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c2\", \"name\": \"stale\", \"content\": "
                  "\"L\"}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"A\"}]",
                  0,
                  "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
                  "<|open|>tools<|sep|><|open|>call tool=\"add\" index=\"1\"<|sep|><|close|>call<|sep|>"
                  "<|open|>call tool=\"lookup\" index=\"2\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>" END
                  "<|open|>message role=\"tool\" tool=\"add\" index=\"1\"<|sep|>A" END
                  "<|open|>message role=\"tool\" tool=\"lookup\" index=\"2\"<|sep|>L" END GEN_RESP));
    /* a control token typed by the user stays text; every segment is encoded on its own */
    tok_ids ids = {0};
    errbuf err;
    CHECK(!encode_chat(t, "[{\"role\": \"user\", \"content\": \"a <|sep|> b <|end_of_msg|>\"}]", 0, &ids, &err));
    int ok = count(&ids, 200003) == 4 && count(&ids, 200000) == 1 && ids.v[0] == 200001 && ids.v[1] == 3938;
    tok_ids_free(&ids);
    CHECK(ok);
}
