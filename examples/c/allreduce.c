/*
 * allreduce.c: join a group from the environment, then run every reduction
 * collective on vectors of a few sizes, check every element against what a
 * plain loop computes from all the ranks' inputs, and time the allreduce.
 *
 *   RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 ./allreduce 1000 1048576   # on each host
 *
 * Arguments: the sizes in elements (default 1 1000 1048576).
 * Environment (as torch and Horovod use it): RANK, WORLD_SIZE, MASTER_ADDR,
 * and optionally MASTER_PORT, AGGBOX_IFACE, AGGBOX_PORT, AGGBOX_DATAPATH
 * (auto, kernel or user) and AGGBOX_TIMEOUT_MS.
 *
 * Every rank fills its buffers from a formula of (rank, index), so that each
 * can compute what a collective must give without being sent the others'
 * inputs. For each size of `count` elements it runs:
 *   - aggbox_allreduce, float SUM, from one buffer into another, timed over
 *     a few iterations (after a barrier): within 1e-6 x max|x| x N of the
 *     exact sum (max|x|: the largest |input| of the call, on any rank), the
 *     bound docs/ALLREDUCE.md gives (float sums are quantized below a
 *     common scale, so an element is exact only to a fraction of max|x|);
 *   - aggbox_allreduce, int64_t MAX, in place: exact;
 *   - aggbox_allreduce, double AVG: within 1e-12 x max|x| x N of the exact
 *     mean (the inputs are multiples of 1/4, so the plain loop's sum is
 *     exact);
 *   - aggbox_reduce, int32_t SUM, to root (size index % N): exact at the
 *     root; the other ranks pass recvbuf NULL;
 *   - aggbox_reduce_scatter, uint64_t SUM (wrapping), of N blocks of
 *     ceil(count / N) elements: exact, block `rank` on each rank;
 *   - aggbox_allgather of ceil(count / N) int32_t per rank: exact;
 *   - aggbox_iallreduce, int32_t MIN, in place, polled with aggbox_test while
 *     the expected values are computed, then finished with aggbox_wait.
 * Prints one line per size on stdout, for scripts (wrapped here):
 *   rank=R size=N datapath=kernel|user count=C iterations=I
 *     us_per_allreduce=X mb_per_s=Y checks=K errors=E retransmits=T
 * (checks: collectives checked, 7 per size; errors: elements that differed
 * from the expected value, the first few also described on stderr;
 * mb_per_s: bytes of the float vector per microsecond of allreduce;
 * retransmits: datagrams this rank sent again so far). Exits with 1 when an
 * element differed or a call failed (printing the status and the
 * library's message on stderr), with 2 on bad arguments.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <errno.h>
#include <inttypes.h>
#include <math.h> /* NAN */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aggbox.h"

/* Collectives checked per size. */
#define CHECKS 7

/* Prints the status of a failed call and the library's message. */
static void report(aggbox_status status) {
    char message[512];
    size_t len = aggbox_last_error(message, sizeof message);
    fprintf(stderr, "allreduce: error (%s): %s%s\n", aggbox_status_string(status), message,
            len >= sizeof message ? "..." : "");
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* A well-mixed 64-bit number of (salt, rank, index) (splitmix64). */
static uint64_t mix(unsigned salt, int rank, size_t i) {
    uint64_t x = ((uint64_t)salt << 56) ^ ((uint64_t)(unsigned)rank << 40) ^ (uint64_t)i;
    x += 0x9E3779B97F4A7C15u;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    return x ^ (x >> 31);
}

/* Rank `rank`'s inputs at index `i`, one formula per collective. */
static float f32_in(unsigned salt, int rank, size_t i) {
    return (float)((int64_t)(mix(salt, rank, i) % 200001) - 100000) / 1000.0f; /* [-100, 100] */
}
static int64_t i64_in(int rank, size_t i) { return (int64_t)mix(20, rank, i); /* any int64_t */ }
static double f64_in(int rank, size_t i) {
    return (double)((int64_t)(mix(30, rank, i) % 4000001) - 2000000) / 4.0; /* quarters */
}
static int32_t i32_in(unsigned salt, int rank, size_t i) {
    return (int32_t)((int64_t)(mix(salt, rank, i) % 2000001) - 1000000); /* N x 1e6 fits */
}
static uint64_t u64_in(int rank, size_t i) { return mix(50, rank, i); }

static double magnitude(double x) { return x < 0 ? -x : x; }

/* Mismatches so far (all sizes), and how many of them were described. */
static long errors;

/* Counts a wrong element, describing the first few on stderr. */
static void wrong(const char *what, size_t count, size_t i, const char *got, const char *want) {
    if (errors++ < 10) {
        fprintf(stderr, "allreduce: %s of %zu elements: element %zu is %s, not %s\n", what, count, i, got, want);
    }
}

/* Checks a float SUM allreduce of `salt` inputs: within 1e-6 x max|x| x N,
 * max|x| the largest |input| of the call on any rank. */
static void check_f32_sum(const float *got, size_t count, int size, unsigned salt) {
    double largest = 0;
    for (size_t i = 0; i < count; i++) {
        for (int r = 0; r < size; r++) {
            double x = magnitude(f32_in(salt, r, i));
            largest = x > largest ? x : largest;
        }
    }
    double bound = 1e-6 * largest * size;
    for (size_t i = 0; i < count; i++) {
        double sum = 0;
        for (int r = 0; r < size; r++) {
            sum += f32_in(salt, r, i); /* exact: N thousandths, far below 2^53 */
        }
        if (!(magnitude((double)got[i] - sum) <= bound)) { /* NaN fails too */
            char g[64], w[96];
            snprintf(g, sizeof g, "%.9g", got[i]);
            snprintf(w, sizeof w, "%.9g (+- %.3g)", sum, bound);
            wrong("allreduce f32 sum", count, i, g, w);
        }
    }
}

static void check_i64_max(const int64_t *got, size_t count, int size) {
    for (size_t i = 0; i < count; i++) {
        int64_t max = INT64_MIN;
        for (int r = 0; r < size; r++) {
            max = i64_in(r, i) > max ? i64_in(r, i) : max;
        }
        if (got[i] != max) {
            char g[64], w[96];
            snprintf(g, sizeof g, "%" PRId64, got[i]);
            snprintf(w, sizeof w, "%" PRId64, max);
            wrong("allreduce i64 max", count, i, g, w);
        }
    }
}

/* Checks a double AVG allreduce: within 1e-12 x max|x| x N. */
static void check_f64_avg(const double *got, size_t count, int size) {
    double largest = 0;
    for (size_t i = 0; i < count; i++) {
        for (int r = 0; r < size; r++) {
            largest = magnitude(f64_in(r, i)) > largest ? magnitude(f64_in(r, i)) : largest;
        }
    }
    double bound = 1e-12 * largest * size;
    for (size_t i = 0; i < count; i++) {
        double sum = 0;
        for (int r = 0; r < size; r++) {
            sum += f64_in(r, i); /* exact: quarters, far below 2^52 */
        }
        double avg = sum / size;
        if (!(magnitude(got[i] - avg) <= bound)) {
            char g[64], w[96];
            snprintf(g, sizeof g, "%.17g", got[i]);
            snprintf(w, sizeof w, "%.17g (+- %.3g)", avg, bound);
            wrong("allreduce f64 avg", count, i, g, w);
        }
    }
}

/* Checks a SUM (`min` 0) or MIN (`min` 1) of int32_t inputs `salt`. */
static void check_i32(const char *what, const int32_t *got, size_t count, int size, unsigned salt, int min) {
    for (size_t i = 0; i < count; i++) {
        int32_t want = min ? INT32_MAX : 0;
        for (int r = 0; r < size; r++) {
            int32_t x = i32_in(salt, r, i);
            /* A sum wraps, as the library's does (and as C's signed one may not). */
            want = min ? (x < want ? x : want) : (int32_t)((uint32_t)want + (uint32_t)x);
        }
        if (got[i] != want) {
            char g[64], w[96];
            snprintf(g, sizeof g, "%" PRId32, got[i]);
            snprintf(w, sizeof w, "%" PRId32, want);
            wrong(what, count, i, g, w);
        }
    }
}

/* Checks block `rank` (`block` elements) of a uint64_t SUM. */
static void check_u64_block(const uint64_t *got, size_t block, int size, int rank) {
    for (size_t k = 0; k < block; k++) {
        size_t i = (size_t)rank * block + k;
        uint64_t sum = 0; /* unsigned: wraps as the library's sum does */
        for (int r = 0; r < size; r++) {
            sum += u64_in(r, i);
        }
        if (got[k] != sum) {
            char g[64], w[96];
            snprintf(g, sizeof g, "%" PRIu64, got[k]);
            snprintf(w, sizeof w, "%" PRIu64, sum);
            wrong("reduce-scatter u64 sum", block * (size_t)size, i, g, w);
        }
    }
}

/* Checks an allgather of `block` int32_t per rank (inputs of salt 60). */
static void check_gathered(const int32_t *got, size_t block, int size) {
    for (int r = 0; r < size; r++) {
        for (size_t k = 0; k < block; k++) {
            int32_t want = i32_in(60, r, k);
            if (got[(size_t)r * block + k] != want) {
                char g[64], w[96];
                snprintf(g, sizeof g, "%" PRId32, got[(size_t)r * block + k]);
                snprintf(w, sizeof w, "%" PRId32 " (rank %d's element %zu)", want, r, k);
                wrong("allgather i32", block * (size_t)size, (size_t)r * block + k, g, w);
            }
        }
    }
}

/* Timed iterations of the float allreduce: about 4 MiB in all, 2 to 20. */
static long iterations_for(size_t count) {
    size_t bytes = count * sizeof(float);
    long n = bytes == 0 ? 20 : (long)((4u << 20) / bytes);
    return n < 2 ? 2 : n > 20 ? 20 : n;
}

/* The buffers of one size. */
struct bufs {
    float *fsend, *frecv;
    int64_t *i64;
    double *f64;
    int32_t *i32, *i32_out, *gather_send, *gather_recv, *async;
    uint64_t *scatter_send, *scatter_recv;
};

static void free_bufs(struct bufs *b) {
    void *all[] = {b->fsend,  b->frecv,       b->i64,         b->f64,          b->i32,         b->i32_out,
                   b->async,  b->gather_send, b->gather_recv, b->scatter_send, b->scatter_recv};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        free(all[k]);
    }
    memset(b, 0, sizeof *b);
}

/* Allocates the buffers of `count` elements (blocks of `block` per rank);
 * returns 0, or -1 when out of memory. */
static int alloc_bufs(struct bufs *b, size_t count, size_t block, int size) {
    size_t n = count > 0 ? count : 1, all = block * (size_t)size > 0 ? block * (size_t)size : 1;
    b->fsend = malloc(n * sizeof(float));
    b->frecv = malloc(n * sizeof(float));
    b->i64 = malloc(n * sizeof(int64_t));
    b->f64 = malloc(n * sizeof(double));
    b->i32 = malloc(n * sizeof(int32_t));
    b->i32_out = malloc(n * sizeof(int32_t));
    b->async = malloc(n * sizeof(int32_t));
    b->gather_send = malloc((block > 0 ? block : 1) * sizeof(int32_t));
    b->gather_recv = malloc(all * sizeof(int32_t));
    b->scatter_send = malloc(all * sizeof(uint64_t));
    b->scatter_recv = malloc((block > 0 ? block : 1) * sizeof(uint64_t));
    if (!b->fsend || !b->frecv || !b->i64 || !b->f64 || !b->i32 || !b->i32_out || !b->async || !b->gather_send ||
        !b->gather_recv || !b->scatter_send || !b->scatter_recv) {
        free_bufs(b);
        return -1;
    }
    return 0;
}

/* Runs and checks every collective on `count` elements; returns the
 * status of the first failed call, or AGGBOX_OK. */
static aggbox_status run_size(aggbox_comm *comm, size_t count, int root, int rank, int size, long *iterations,
                              double *total_us) {
    size_t block = (count + (size_t)size - 1) / (size_t)size;
    struct bufs b;
    memset(&b, 0, sizeof b);
    if (alloc_bufs(&b, count, block, size) != 0) {
        fprintf(stderr, "allreduce: no memory for %zu elements\n", count);
        return AGGBOX_ERR_SYSTEM;
    }
    aggbox_status status = aggbox_barrier(comm); /* everyone starts the clock together */

    /* float SUM, sendbuf != recvbuf, timed; new inputs every iteration. */
    *iterations = iterations_for(count);
    *total_us = 0;
    for (long it = 0; it < *iterations && status == AGGBOX_OK; it++) {
        unsigned salt = 10 + (unsigned)it % 8;
        for (size_t i = 0; i < count; i++) {
            b.fsend[i] = f32_in(salt, rank, i);
            b.frecv[i] = NAN;
        }
        double start = now_us();
        status = aggbox_allreduce(comm, b.fsend, b.frecv, count, AGGBOX_DTYPE_F32, AGGBOX_OP_SUM);
        *total_us += now_us() - start;
        if (status == AGGBOX_OK) {
            check_f32_sum(b.frecv, count, size, salt);
        }
    }

    /* int64_t MAX, in place. */
    if (status == AGGBOX_OK) {
        for (size_t i = 0; i < count; i++) {
            b.i64[i] = i64_in(rank, i);
        }
        status = aggbox_allreduce(comm, b.i64, b.i64, count, AGGBOX_DTYPE_I64, AGGBOX_OP_MAX);
        if (status == AGGBOX_OK) {
            check_i64_max(b.i64, count, size);
        }
    }

    /* double AVG, in place. */
    if (status == AGGBOX_OK) {
        for (size_t i = 0; i < count; i++) {
            b.f64[i] = f64_in(rank, i);
        }
        status = aggbox_allreduce(comm, b.f64, b.f64, count, AGGBOX_DTYPE_F64, AGGBOX_OP_AVG);
        if (status == AGGBOX_OK) {
            check_f64_avg(b.f64, count, size);
        }
    }

    /* int32_t SUM to `root`; recvbuf only there. */
    if (status == AGGBOX_OK) {
        for (size_t i = 0; i < count; i++) {
            b.i32[i] = i32_in(40, rank, i);
        }
        int32_t *recv = rank == root ? b.i32_out : NULL;
        status = aggbox_reduce(comm, b.i32, recv, count, AGGBOX_DTYPE_I32, AGGBOX_OP_SUM, root);
        if (status == AGGBOX_OK && rank == root) {
            check_i32("reduce i32 sum", b.i32_out, count, size, 40, 0);
        }
    }

    /* uint64_t SUM of N blocks, scattered. */
    if (status == AGGBOX_OK) {
        for (size_t i = 0; i < block * (size_t)size; i++) {
            b.scatter_send[i] = u64_in(rank, i);
        }
        status = aggbox_reduce_scatter(comm, b.scatter_send, b.scatter_recv, block, AGGBOX_DTYPE_U64, AGGBOX_OP_SUM);
        if (status == AGGBOX_OK) {
            check_u64_block(b.scatter_recv, block, size, rank);
        }
    }

    /* Allgather of one block per rank. */
    if (status == AGGBOX_OK) {
        for (size_t k = 0; k < block; k++) {
            b.gather_send[k] = i32_in(60, rank, k);
        }
        status = aggbox_allgather(comm, b.gather_send, b.gather_recv, block, AGGBOX_DTYPE_I32);
        if (status == AGGBOX_OK) {
            check_gathered(b.gather_recv, block, size);
        }
    }

    /* int32_t MIN in place, asynchronous: the expected values are computed
     * while it runs (into i32_out; `async` is the library's until done). */
    if (status == AGGBOX_OK) {
        for (size_t i = 0; i < count; i++) {
            b.async[i] = i32_in(70, rank, i);
        }
        aggbox_request *request = NULL;
        status = aggbox_iallreduce(comm, b.async, b.async, count, AGGBOX_DTYPE_I32, AGGBOX_OP_MIN, &request);
        if (status == AGGBOX_OK) {
            int done = 0;
            status = aggbox_test(request, &done);
            for (size_t i = 0; i < count && status == AGGBOX_OK; i++) {
                int32_t want = INT32_MAX;
                for (int r = 0; r < size; r++) {
                    int32_t x = i32_in(70, r, i);
                    want = x < want ? x : want;
                }
                b.i32_out[i] = want;
            }
            if (status == AGGBOX_OK && !done) {
                status = aggbox_wait(request);
            }
            aggbox_request_free(request);
        }
        for (size_t i = 0; i < count && status == AGGBOX_OK; i++) {
            if (b.async[i] != b.i32_out[i]) {
                char g[64], w[96];
                snprintf(g, sizeof g, "%" PRId32, b.async[i]);
                snprintf(w, sizeof w, "%" PRId32, b.i32_out[i]);
                wrong("iallreduce i32 min", count, i, g, w);
            }
        }
    }
    free_bufs(&b);
    return status;
}

/* Parses a count of elements; returns 0 and sets *count, or -1. */
static int parse_count(const char *text, size_t *count) {
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || value > SIZE_MAX / 64) {
        return -1;
    }
    *count = (size_t)value;
    return 0;
}

int main(int argc, char **argv) {
    static const char *defaults[] = {"1", "1000", "1048576"};
    int nsizes = argc > 1 ? argc - 1 : 3;
    const char **sizes = argc > 1 ? (const char **)argv + 1 : defaults;
    for (int s = 0; s < nsizes; s++) {
        size_t count;
        if (parse_count(sizes[s], &count) != 0) {
            fprintf(stderr, "usage: %s [size in elements ...]: %s is not a size\n", argv[0], sizes[s]);
            return 2;
        }
    }

    aggbox_comm *comm = NULL;
    aggbox_status status = aggbox_comm_init_from_env(&comm);
    if (status != AGGBOX_OK) {
        report(status);
        return 1;
    }
    int rank = aggbox_comm_rank(comm);
    int size = aggbox_comm_size(comm);
    const char *datapath = aggbox_comm_datapath(comm) == AGGBOX_DATAPATH_KERNEL ? "kernel" : "user";

    for (int s = 0; s < nsizes && status == AGGBOX_OK; s++) {
        size_t count;
        parse_count(sizes[s], &count);
        long before = errors, iterations = 0;
        double total_us = 0;
        status = run_size(comm, count, s % size, rank, size, &iterations, &total_us);
        aggbox_stats stats = {.size = sizeof stats};
        if (status == AGGBOX_OK) {
            status = aggbox_comm_stats(comm, &stats);
        }
        if (status != AGGBOX_OK) {
            break;
        }
        double per = total_us / (double)iterations;
        printf("rank=%d size=%d datapath=%s count=%zu iterations=%ld us_per_allreduce=%.1f mb_per_s=%.1f"
               " checks=%d errors=%ld retransmits=%" PRIu64 "\n",
               rank, size, datapath, count, iterations, per,
               per > 0 ? (double)(count * sizeof(float)) / per : 0.0, CHECKS, errors - before, stats.retransmits);
        fflush(stdout);
    }
    if (status != AGGBOX_OK) {
        report(status);
    }
    aggbox_comm_destroy(comm);
    return status == AGGBOX_OK && errors == 0 ? 0 : 1;
}
