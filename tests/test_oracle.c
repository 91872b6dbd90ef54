/* test_oracle.c — conformance with the reference implementations: every case under
 * tests/data/oracle (tiny checkpoints with logits from Moonshot's and Hugging Face's own code,
 * run in float64). Logits must be within 1e-3 relative L2 error at every position of every
 * prompt, and greedy continuations must agree up to the first step whose top-2 margin is below
 * 0.02 (too close to call between float32 and float64). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "test.h"
#include "test_util.h"

static void check_case(const char *dir, double *worst)
{
    char path[4096];
    errbuf err;
    model m;
    CHECKF(model_load(&m, dir, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_error_t je;
    json_t *exp = json_load_file(path, 0, &je);
    CHECKF(exp, "%s: %s", path, je.text);
    json_t *prompts = json_object_get(exp, "prompts");
    int V = m.hp.vocab;
    for (size_t pi = 0; pi < json_array_size(prompts) && !test_failed(); pi++) {
        json_t *p = json_array_get(prompts, pi), *jids = json_object_get(p, "ids");
        json_t *greedy = json_object_get(p, "greedy"), *margins = json_object_get(p, "margins");
        int n = (int)json_array_size(jids), G = (int)json_array_size(greedy);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + G));
        for (int i = 0; i < n; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(p, "logits_file")));
        size_t nref;
        float *ref = tu_read_f32(path, &nref);
        float *got = tu_eval(&m, ids, n, n, 2, NULL, &err);
        if (!ref || !got || nref != (size_t)n * V) {
            test_fail(__FILE__, __LINE__, "%s prompt %zu: %s", dir, pi, !got ? err.msg : "bad reference file");
        } else {
            for (int t = 0; t < n; t++) {
                double e = tu_rel_err(got + (size_t)t * V, ref + (size_t)t * V, (size_t)V);
                if (e > *worst)
                    *worst = e;
                if (!(e <= 1e-3)) {
                    test_fail(__FILE__, __LINE__, "%s prompt %zu (len %d) position %d: rel err %.2e", dir, pi, n, t,
                              e);
                    break;
                }
            }
        }
        /* greedy continuation through a session, one token per pass */
        if (!test_failed()) {
            engine *e = tu_engine(&m, NULL, 2, NULL, &err);
            session *s = e ? tu_session(e, n + G, n, &err) : NULL;
            session_pass pass = {.tokens = ids, .T = n, .n_logits = 1};
            if (s && session_run(s, &pass, &err) == 0) {
                const float *lg = session_logits(s, n - 1);
                for (int g = 0; g < G; g++) {
                    int32_t want = (int32_t)json_integer_value(json_array_get(greedy, (size_t)g));
                    int32_t pick = sampler_argmax(lg, V);
                    double margin = json_number_value(json_array_get(margins, (size_t)g));
                    if (pick != want) {
                        if (margin >= 0.02)
                            test_fail(__FILE__, __LINE__, "%s prompt %zu greedy step %d: %d, reference %d (margin %.3f)",
                                      dir, pi, g, pick, want, margin);
                        break;
                    }
                    if (margin < 0.02)
                        break;
                    pass = (session_pass){.tokens = &pick, .T = 1, .n_logits = 1};
                    if (session_run(s, &pass, &err) != 0) {
                        test_fail(__FILE__, __LINE__, "%s: %s", dir, err.msg);
                        break;
                    }
                    lg = session_logits(s, 0);
                }
            } else {
                test_fail(__FILE__, __LINE__, "%s: %s", dir, err.msg);
            }
            session_free(s);
            engine_free(e);
        }
        free(ids);
        free(ref);
        free(got);
    }
    json_decref(exp);
    model_free(&m);
}

TEST(oracle_all_cases)
{
    char **names;
    int n = tu_list_dirs(test_data("oracle"), &names);
    CHECKF(n >= 9, "expected at least the 9 shared oracle cases under %s, found %d", test_data("oracle"), n);
    for (int i = 0; i < n; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", test_data("oracle"), names[i]);
        double worst = 0;
        check_case(dir, &worst);
        if (!test_failed())
            printf("     oracle %-22s worst rel err %.1e\n", names[i], worst);
        free(names[i]);
    }
    free(names);
}
