/*
 * broadcast.c: join a group from the environment, then broadcast buffers of
 * a few sizes from rank 0, check every byte, and time them.
 *
 *   RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 ./broadcast 1024 1048576   # on each host
 *
 * Arguments: the sizes in bytes (default 1024 65536 1048576 16777216).
 * Environment (as torch and Horovod use it): RANK, WORLD_SIZE, MASTER_ADDR,
 * and optionally MASTER_PORT, AGGBOX_IFACE, AGGBOX_PORT, AGGBOX_DATAPATH
 * (auto, kernel or user) and AGGBOX_TIMEOUT_MS.
 *
 * For each size it runs one asynchronous broadcast (aggbox_ibroadcast,
 * polled with aggbox_test, finished with aggbox_wait), then, after a
 * barrier, a timed loop of blocking ones (aggbox_broadcast). Sizes that are
 * a multiple of 4 bytes go as int32_t elements, others as bytes. The root
 * writes a pattern that changes every iteration; every rank checks it.
 * Prints one line per size on stdout, for scripts (wrapped here):
 *   rank=R size=S datapath=kernel|user bytes=B iterations=N us_per_bcast=X
 *     mb_per_s=Y errors=E retransmits=N
 * (errors: broadcasts whose buffer differed from the root's; retransmits:
 * datagrams this rank sent again so far). On a failed call it prints the
 * status and the library's message on stderr and exits with 1.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "aggbox.h"

/* Prints the status of a failed call and the library's message. */
static void report(aggbox_status status) {
    char message[512];
    size_t len = aggbox_last_error(message, sizeof message);
    fprintf(stderr, "broadcast: error (%s): %s%s\n", aggbox_status_string(status), message,
            len >= sizeof message ? "..." : "");
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* The byte the root puts at `offset` in iteration `iteration`. */
static unsigned char pattern(size_t offset, long iteration) {
    return (unsigned char)(offset * 131u + (size_t)iteration * 7u + (offset >> 12));
}

/* Fills `buf` as the root does (rank 0), or with other bytes. */
static void fill(unsigned char *buf, size_t bytes, long iteration, int rank) {
    for (size_t i = 0; i < bytes; i++) {
        buf[i] = rank == 0 ? pattern(i, iteration) : (unsigned char)~pattern(i, iteration);
    }
}

/* Whether `buf` holds the root's bytes of `iteration`. */
static int matches(const unsigned char *buf, size_t bytes, long iteration) {
    for (size_t i = 0; i < bytes; i++) {
        if (buf[i] != pattern(i, iteration)) {
            return 0;
        }
    }
    return 1;
}

/* Iterations timed for a size: about 4 MiB in all, 3 to 200. */
static long iterations_for(size_t bytes) {
    long n = bytes == 0 ? 200 : (long)((4u << 20) / bytes);
    return n < 3 ? 3 : n > 200 ? 200 : n;
}

/* The element type and count of a buffer of `bytes` bytes. */
static aggbox_dtype dtype_for(size_t bytes, size_t *count) {
    if (bytes % sizeof(int32_t) == 0) {
        *count = bytes / sizeof(int32_t);
        return AGGBOX_DTYPE_I32;
    }
    *count = bytes;
    return AGGBOX_DTYPE_U8;
}

/* One asynchronous broadcast of `bytes` bytes, polled then waited for.
 * Returns its status; counts a wrong buffer in *errors. */
static aggbox_status async_once(aggbox_comm *comm, unsigned char *buf, size_t bytes, int rank, long *errors) {
    size_t count;
    aggbox_dtype dtype = dtype_for(bytes, &count);
    fill(buf, bytes, -1, rank);
    aggbox_request *request = NULL;
    aggbox_status status = aggbox_ibroadcast(comm, buf, count, dtype, 0, &request);
    if (status != AGGBOX_OK) {
        return status;
    }
    /* The buffer is the library's until the request is done. */
    int done = 0;
    status = aggbox_test(request, &done);
    if (status == AGGBOX_OK && !done) {
        status = aggbox_wait(request);
    }
    aggbox_request_free(request);
    if (status == AGGBOX_OK && !matches(buf, bytes, -1)) {
        (*errors)++;
    }
    return status;
}

/* Times `iterations` blocking broadcasts of `bytes` bytes; returns the
 * status of the first failed call, or AGGBOX_OK. */
static aggbox_status timed(aggbox_comm *comm, unsigned char *buf, size_t bytes, long iterations, int rank,
                           long *errors, double *total_us) {
    size_t count;
    aggbox_dtype dtype = dtype_for(bytes, &count);
    *total_us = 0;
    for (long i = 0; i < iterations; i++) {
        fill(buf, bytes, i, rank);
        double start = now_us();
        aggbox_status status = aggbox_broadcast(comm, buf, count, dtype, 0);
        *total_us += now_us() - start;
        if (status != AGGBOX_OK) {
            return status;
        }
        if (!matches(buf, bytes, i)) {
            (*errors)++;
        }
    }
    return AGGBOX_OK;
}

/* Parses a size in bytes; returns 0 and sets *bytes, or -1. */
static int parse_size(const char *text, size_t *bytes) {
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
        return -1;
    }
    *bytes = (size_t)value;
    return 0;
}

int main(int argc, char **argv) {
    static const char *defaults[] = {"1024", "65536", "1048576", "16777216"};
    int nsizes = argc > 1 ? argc - 1 : 4;
    const char **sizes = argc > 1 ? (const char **)argv + 1 : defaults;
    size_t largest = 0;
    for (int s = 0; s < nsizes; s++) {
        size_t bytes;
        if (parse_size(sizes[s], &bytes) != 0) {
            fprintf(stderr, "usage: %s [size in bytes ...]: %s is not a size\n", argv[0], sizes[s]);
            return 2;
        }
        largest = bytes > largest ? bytes : largest;
    }
    unsigned char *buf = malloc(largest > 0 ? largest : 1);
    if (buf == NULL) {
        fprintf(stderr, "broadcast: no memory for %zu bytes\n", largest);
        return 1;
    }

    aggbox_comm *comm = NULL;
    aggbox_status status = aggbox_comm_init_from_env(&comm);
    if (status != AGGBOX_OK) {
        report(status);
        free(buf);
        return 1;
    }
    int rank = aggbox_comm_rank(comm);
    int size = aggbox_comm_size(comm);
    const char *datapath = aggbox_comm_datapath(comm) == AGGBOX_DATAPATH_KERNEL ? "kernel" : "user";

    for (int s = 0; s < nsizes && status == AGGBOX_OK; s++) {
        size_t bytes;
        parse_size(sizes[s], &bytes);
        long iterations = iterations_for(bytes), errors = 0;
        double total_us = 0;
        status = async_once(comm, buf, bytes, rank, &errors);
        if (status == AGGBOX_OK) {
            status = aggbox_barrier(comm); /* everyone starts the clock together */
        }
        if (status == AGGBOX_OK) {
            status = timed(comm, buf, bytes, iterations, rank, &errors, &total_us);
        }
        aggbox_stats stats = {.size = sizeof stats};
        if (status == AGGBOX_OK) {
            status = aggbox_comm_stats(comm, &stats);
        }
        if (status != AGGBOX_OK) {
            break;
        }
        double per = total_us / (double)iterations;
        printf("rank=%d size=%d datapath=%s bytes=%zu iterations=%ld us_per_bcast=%.1f mb_per_s=%.1f"
               " errors=%ld retransmits=%" PRIu64 "\n",
               rank, size, datapath, bytes, iterations, per, per > 0 ? (double)bytes / per : 0.0, errors,
               stats.retransmits);
        fflush(stdout);
    }
    if (status != AGGBOX_OK) {
        report(status);
    }
    aggbox_comm_destroy(comm);
    free(buf);
    return status == AGGBOX_OK ? 0 : 1;
}
