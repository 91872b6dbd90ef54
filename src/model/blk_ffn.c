/* blk_ffn.c — the gated MLP: down(act(gate x, up x)), with SiLU-GLU or SiTU-GLU. Used by dense
 * layers, shared experts and (through blk_moe.c) every routed expert. */
#include "model/blk.h"

int blk_mlp(const blk *b, const mlp_w *w, int inter, const float *x, int T, float *out)
{
    float *g = blk_alloc(b, (size_t)T * inter), *u = blk_alloc(b, (size_t)T * inter);
    if (!g || !u)
        return -1;
    blk_matmul(b, &w->gate, x, T, g);
    blk_matmul(b, &w->up, x, T, u);
    blk_glu(b, g, u, (size_t)T * inter);
    blk_matmul(b, &w->down, g, T, out);
    return 0;
}
