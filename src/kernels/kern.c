/* kern.c — choosing a kernel table at run time. */
#include <string.h>

#include "kernels/kern.h"

const kern_ops *kern_select(const char *name)
{
    if (name && strcmp(name, "auto") != 0) {
        if (strcmp(name, "scalar") == 0)
            return &kern_scalar;
        if (strcmp(name, "avx2") == 0)
            return kern_avx2();
        if (strcmp(name, "avx512") == 0)
            return kern_avx512();
        if (strcmp(name, "neon") == 0)
            return kern_neon();
        return NULL;
    }
    const kern_ops *k;
    if ((k = kern_avx512()) || (k = kern_avx2()) || (k = kern_neon()))
        return k;
    return &kern_scalar;
}
