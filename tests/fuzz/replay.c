/* replay.c — runs a libFuzzer target over a corpus without libFuzzer, so `make test` replays
 * every fuzz corpus with any compiler (and under ASan with `make asan`).
 * usage: fuzz_x DIR_OR_FILE...   Prints "replayed N inputs" and exits 0 unless a target
 * crashes (which ends the process with a signal) or an input cannot be read. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf)
        return -1;
    /* an exact-size copy so ASan sees reads past the end */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv)
{
    int count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) != 0)
                return 1;
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        char **names = NULL;
        int n = 0;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            names = realloc(names, sizeof *names * (size_t)(n + 1));
            names[n++] = strdup(e->d_name);
        }
        if (d)
            closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp);
        for (int j = 0; j < n; j++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[j]);
            if (run_file(path) != 0)
                return 1;
            count++;
            free(names[j]);
        }
        free(names);
    }
    printf("replayed %d inputs\n", count);
    return 0;
}
