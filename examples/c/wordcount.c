/*
 * wordcount.c: a MapReduce word count with AggBox's key-value reduce.
 *
 *   RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 ./wordcount [--all] FILE...   # on each host
 *
 * Every rank reads the files whose position on the command line, mod
 * WORLD_SIZE, is its rank, splits them into words (runs of ASCII letters
 * and digits, lower-cased, at most 64 bytes; longer runs are skipped),
 * emits each word with the value 1 (aggbox_kv_emit, 4096 at a time), and
 * gets from aggbox_kv_finish the counts of the words it owns (a word is
 * owned by rank fnv1a64(word) mod WORLD_SIZE). Environment as in
 * barrier.c.
 *
 * Prints on stdout, for scripts:
 *   rank=R size=S datapath=kernel|user words=W owned=K total_us=T
 *     local=N combined=N folded_user=N folded_kernel=N spilled=N
 *   top=WORD:COUNT,WORD:COUNT,WORD:COUNT   (its three most frequent words)
 * and with --all one line `pair WORD COUNT` per word it owns. On any error
 * it prints the status and the library's message on stderr and exits
 * with 1. Build it with the Makefile beside it.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aggbox.h"

#define KEY_MAX 64
#define BATCH 4096

static void report(aggbox_status status) {
    char message[512];
    size_t len = aggbox_last_error(message, sizeof message);
    fprintf(stderr, "wordcount: error (%s): %s%s\n", aggbox_status_string(status), message,
            len >= sizeof message ? "..." : "");
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* A batch of words waiting to be emitted. */
struct batch {
    uint8_t keys[BATCH * KEY_MAX];
    uint32_t lens[BATCH];
    int64_t values[BATCH];
    size_t n, bytes;
};

static aggbox_status flush(aggbox_kv *kv, struct batch *b) {
    aggbox_status status = aggbox_kv_emit(kv, b->keys, b->lens, b->values, b->n);
    b->n = 0;
    b->bytes = 0;
    return status;
}

/* Emits the words of `path`; returns the status of the last emit. */
static aggbox_status count_file(aggbox_kv *kv, struct batch *b, const char *path, uint64_t *words) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "wordcount: cannot read %s (skipped)\n", path);
        return AGGBOX_OK;
    }
    uint8_t word[KEY_MAX];
    size_t len = 0;
    int too_long = 0, c;
    aggbox_status status = AGGBOX_OK;
    do {
        c = fgetc(f);
        if (c != EOF && c < 128 && isalnum(c)) {
            if (len < KEY_MAX)
                word[len++] = (uint8_t)tolower(c);
            else
                too_long = 1;
            continue;
        }
        if (len > 0 && !too_long) {
            memcpy(b->keys + b->bytes, word, len);
            b->bytes += len;
            b->lens[b->n] = (uint32_t)len;
            b->values[b->n] = 1;
            b->n++;
            (*words)++;
            if (b->n == BATCH && (status = flush(kv, b)) != AGGBOX_OK)
                break;
        }
        len = 0;
        too_long = 0;
    } while (c != EOF);
    fclose(f);
    return status;
}

int main(int argc, char **argv) {
    int all = 0, first = 1;
    if (argc > 1 && strcmp(argv[1], "--all") == 0) {
        all = 1;
        first = 2;
    }
    aggbox_comm *comm;
    aggbox_status status = aggbox_comm_init_from_env(&comm);
    if (status != AGGBOX_OK) {
        report(status);
        return 1;
    }
    int rank = aggbox_comm_rank(comm), size = aggbox_comm_size(comm);
    aggbox_kv_config config;
    aggbox_kv_config_init(&config);
    config.key_max = KEY_MAX;
    config.dtype = AGGBOX_DTYPE_I64;
    config.op = AGGBOX_OP_SUM;
    struct batch *b = calloc(1, sizeof *b);
    aggbox_kv *kv = NULL;
    aggbox_kv_result *result = NULL;
    uint64_t words = 0;
    double start = now_us();
    if (!b) {
        fprintf(stderr, "wordcount: out of memory\n");
        aggbox_comm_destroy(comm);
        return 1;
    }
    status = aggbox_kv_begin(comm, &config, &kv);
    for (int i = first; status == AGGBOX_OK && i < argc; i++)
        if ((i - first) % size == rank)
            status = count_file(kv, b, argv[i], &words);
    if (status == AGGBOX_OK && b->n > 0)
        status = flush(kv, b);
    if (kv) {
        /* Always: it frees kv, and reports an emit's failure again. */
        aggbox_status finished = aggbox_kv_finish(kv, &result);
        if (status == AGGBOX_OK)
            status = finished;
    }
    double elapsed = now_us() - start;
    if (status != AGGBOX_OK) {
        report(status);
        free(b);
        aggbox_comm_destroy(comm);
        return 1;
    }
    size_t owned = aggbox_kv_result_len(result);
    aggbox_kv_stats stats = {.size = sizeof stats};
    aggbox_kv_result_stats(result, &stats);
    printf("rank=%d size=%d datapath=%s words=%" PRIu64 " owned=%zu total_us=%.0f local=%" PRIu64
           " combined=%" PRIu64 " folded_user=%" PRIu64 " folded_kernel=%" PRIu64 " spilled=%" PRIu64 "\n",
           rank, size, aggbox_comm_datapath(comm) == AGGBOX_DATAPATH_KERNEL ? "kernel" : "user", words, owned,
           elapsed, stats.pairs_local, stats.pairs_combined, stats.pairs_folded_user, stats.pairs_folded_kernel,
           stats.spilled);
    /* The three most frequent words this rank owns. */
    size_t top[3] = {0, 0, 0};
    int64_t topv[3] = {-1, -1, -1};
    for (size_t i = 0; i < owned; i++) {
        const uint8_t *key;
        uint32_t len;
        int64_t value;
        aggbox_kv_result_get(result, i, &key, &len, &value);
        if (all)
            printf("pair %.*s %" PRId64 "\n", (int)len, (const char *)key, value);
        for (int t = 0; t < 3; t++) {
            if (value > topv[t]) {
                for (int u = 2; u > t; u--) {
                    top[u] = top[u - 1];
                    topv[u] = topv[u - 1];
                }
                top[t] = i;
                topv[t] = value;
                break;
            }
        }
    }
    printf("top=");
    for (int t = 0; t < 3 && topv[t] >= 0; t++) {
        const uint8_t *key;
        uint32_t len;
        int64_t value;
        aggbox_kv_result_get(result, top[t], &key, &len, &value);
        printf("%s%.*s:%" PRId64, t ? "," : "", (int)len, (const char *)key, value);
    }
    printf("\n");
    aggbox_kv_result_free(result);
    free(b);
    aggbox_comm_destroy(comm);
    return 0;
}
