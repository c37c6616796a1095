/* bench_common.h: what the Open MPI baselines bcast_bench.c and
 * allreduce_bench.c share (their options, round counts, timing, the setup
 * line and the barrier line, the percentiles and the output format).
 *
 * For one program, one translation unit: everything here is static. A
 * program defines, before including this header,
 *   #define BENCH_NAME "bcast_bench"     the prefix of its diagnostics
 *   #define BENCH_USAGE "usage: ..."     its usage text (lines ending in \n)
 * and then its own payload, check and timed round (a bench_round_fn), and a
 * main() that is usually just a call of bench_main().
 *
 * What it provides:
 *   rank, nranks        this process's rank in MPI_COMM_WORLD and its size
 *   usage()             BENCH_USAGE on stderr (rank 0), MPI_Finalize, exit(2);
 *                       what the parsers here do with a bad argument
 *   die(msg)            "BENCH_NAME: rank R: msg" on stderr, then MPI_Abort
 *   parse_long(s, what) a whole number >= 0, or usage()
 *   parse_scaled(s, what, bytes, min, range)
 *                       a whole number with an optional K, M or G suffix
 *                       (powers of 1024), then an optional "i" (64Ki) and,
 *                       with `bytes`, an optional "B" (64KiB, 64KB); anything
 *                       else is "bad WHAT: S" and usage(). It must lie in
 *                       min..INT32_MAX, or it is "WHAT S RANGE" and usage().
 *   now()               seconds on CLOCK_MONOTONIC
 *   cmp_double, pct     qsort order; nearest-rank percentile of a sorted array
 *   report(op, bytes, samples, spans, n)
 *                       sorts the samples (and spans) and prints, on stdout,
 *                         mpi op=OP bytes=N rounds=R p50_us=X p99_us=Y
 *                       plus " span_p50_us=A span_p99_us=B" when spans is not
 *                       NULL (rank 0 calls it)
 *   barrier_round(...)  one barrier sample: MPI_Barrier; t0; MPI_Barrier;
 *                       elapsed; Reduce MAX to rank 0 (a bench_round_fn)
 *   pick_rounds(per, max_rounds, min_rounds, budget)
 *                       rank 0's choice of the number of timed rounds, which
 *                       every rank learns
 *   struct bench        the options, the sample arrays and the round counter
 *   bench_init(&b, &argc, &argv)
 *                       MPI_Init, rank/nranks, and the options
 *                         -r ROUNDS (1000) -w WARMUP (3) -t SECONDS (0.5)
 *                         -m MIN_ROUNDS (5) -s (spans) -h (usage)
 *                       returns the index in argv of the first operand
 *   bench_operands(argc, argv, first, parse, &n, &max)
 *                       the operands argv[first..] through parse() (calloc'd;
 *                       n of them; *max raised to the largest)
 *   bench_begin(&b)     allocates the samples and prints the first line,
 *                         mpi ranks=P netns=K library="..."
 *                       (P ranks in K distinct network namespaces)
 *   bench_measure(&b, op, bytes, fn, ctx, n, spans)
 *                       WARMUP untimed rounds of fn, then as many timed ones
 *                       as pick_rounds says, each with the next value of the
 *                       global round counter; rank 0 reports them as OP
 *                       (with the spans if `spans`)
 *   bench_end(&b)       measures and reports the barrier, frees the samples,
 *                       MPI_Finalize
 *   bench_main(argc, argv, op, parse, unit, min_units, fn)
 *                       a whole program made of the above: the options, the
 *                       operands (through parse(), in units of `unit` bytes),
 *                       a buffer (4096-aligned, zeroed) of the largest of
 *                       them (at least min_units), the first line, one OP line
 *                       per operand (bytes=operand*unit; fn's round on the
 *                       buffer), the barrier line; returns main's exit code
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#if !defined(BENCH_NAME) || !defined(BENCH_USAGE)
#error "define BENCH_NAME and BENCH_USAGE (strings) before including bench_common.h"
#endif

#include <mpi.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

static int rank, nranks;

static void usage(void) {
    if (rank == 0) fprintf(stderr, "%s", BENCH_USAGE);
    MPI_Finalize();
    exit(2);
}

static void die(const char *msg) {
    fprintf(stderr, BENCH_NAME ": rank %d: %s\n", rank, msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static long parse_long(const char *s, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0) {
        if (rank == 0) fprintf(stderr, BENCH_NAME ": bad %s: %s\n", what, s);
        usage();
    }
    return v;
}

static size_t parse_scaled(const char *s, const char *what, int bytes, unsigned long long min,
                           const char *range) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') goto bad;
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ULL << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1ULL << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1ULL << 30, end++;
    if (*end == 'i' || (bytes && *end == 'B')) end++; /* allow 64Ki, 64KiB, 64KB */
    if (bytes && *end == 'B') end++;
    if (*end) goto bad;
    v *= mul;
    if (v < min || v > (unsigned long long)INT32_MAX) {
        if (rank == 0) fprintf(stderr, BENCH_NAME ": %s %s %s\n", what, s, range);
        usage();
    }
    return (size_t)v;
bad:
    if (rank == 0) fprintf(stderr, BENCH_NAME ": bad %s: %s\n", what, s);
    usage();
    return 0;
}

/* Seconds on CLOCK_MONOTONIC, rather than MPI_Wtime, so that -s can rely on
 * one clock for every process of a machine (network namespaces share it). */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, long n, double p) {
    long k = (long)ceil(p * (double)n) - 1;
    if (k < 0) k = 0;
    if (k >= n) k = n - 1;
    return v[k];
}

static void report(const char *op, size_t bytes, double *samples, double *spans, long n) {
    qsort(samples, (size_t)n, sizeof *samples, cmp_double);
    printf("mpi op=%s bytes=%zu rounds=%ld p50_us=%.1f p99_us=%.1f", op, bytes, n,
           pct(samples, n, 0.50) * 1e6, pct(samples, n, 0.99) * 1e6);
    if (spans) {
        qsort(spans, (size_t)n, sizeof *spans, cmp_double);
        printf(" span_p50_us=%.1f span_p99_us=%.1f", pct(spans, n, 0.50) * 1e6,
               pct(spans, n, 0.99) * 1e6);
    }
    printf("\n");
    fflush(stdout);
}

/* One round of a measured operation on n units of ctx, the round'th of the
 * run: returns the slowest rank's time on rank 0 (0 elsewhere) and sets
 * *span (see -s; meaningful on rank 0). */
typedef double (*bench_round_fn)(void *ctx, size_t n, long round, double *span);

/* One barrier round (ctx, n and round unused; *span = 0). */
static double barrier_round(void *ctx, size_t n, long round, double *span) {
    (void)ctx, (void)n, (void)round;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    MPI_Barrier(MPI_COMM_WORLD);
    double mine = now() - t0;
    double slowest = 0;
    MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    *span = 0;
    return slowest;
}

/* Rank 0 picks the number of timed rounds from the fastest warm-up round's
 * wall time (which includes filling and checking, i.e. what a timed round will
 * cost; the fastest, because the first rounds also open TCP connections) and
 * every rank learns it. */
static long pick_rounds(double per, long max_rounds, long min_rounds, double budget) {
    long r = max_rounds;
    if (rank == 0 && budget > 0) {
        if (per > 0 && per * (double)max_rounds > budget) {
            r = (long)(budget / per);
            if (r < min_rounds) r = min_rounds;
            if (r > max_rounds) r = max_rounds;
        }
    }
    MPI_Bcast(&r, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    return r;
}

struct bench {
    long max_rounds, warmup, min_rounds; /* -r, -w, -m */
    double budget;                       /* -t */
    int span;                            /* -s */
    double *samples, *spans;             /* max_rounds each, from bench_begin */
    long round; /* global round counter: every round's payload differs */
};

static int bench_init(struct bench *b, int *argc, char ***argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    *b = (struct bench){.max_rounds = 1000, .warmup = 3, .min_rounds = 5, .budget = 0.5};
    int opt;
    opterr = 0;
    while ((opt = getopt(*argc, *argv, "r:w:t:m:sh")) != -1) {
        switch (opt) {
        case 'r': b->max_rounds = parse_long(optarg, "ROUNDS"); break;
        case 'w': b->warmup = parse_long(optarg, "WARMUP"); break;
        case 'm': b->min_rounds = parse_long(optarg, "MIN_ROUNDS"); break;
        case 's': b->span = 1; break;
        case 't': {
            char *end;
            b->budget = strtod(optarg, &end);
            if (end == optarg || *end || b->budget < 0) usage();
            break;
        }
        default: usage();
        }
    }
    if (b->max_rounds < 1) b->max_rounds = 1;
    if (b->min_rounds < 1) b->min_rounds = 1;
    if (b->min_rounds > b->max_rounds) b->min_rounds = b->max_rounds;
    return optind;
}

/* usage() if there are none. */
static size_t *bench_operands(int argc, char **argv, int first, size_t (*parse)(const char *),
                              int *n, size_t *max) {
    *n = argc - first;
    if (*n < 1) usage();
    size_t *v = calloc((size_t)*n, sizeof *v);
    if (!v) die("out of memory");
    for (int i = 0; i < *n; i++) {
        v[i] = parse(argv[first + i]);
        if (v[i] > *max) *max = v[i];
    }
    return v;
}

static void bench_begin(struct bench *b) {
    b->samples = calloc((size_t)b->max_rounds, sizeof *b->samples);
    b->spans = calloc((size_t)b->max_rounds, sizeof *b->spans);
    if (!b->samples || !b->spans) die("out of memory");

    /* How many network namespaces the ranks are spread over (one per rank
     * is what the comparison wants). */
    struct stat st;
    unsigned long long myns = stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    unsigned long long *allns = rank == 0 ? calloc((size_t)nranks, sizeof *allns) : NULL;
    if (rank == 0 && !allns) die("out of memory");
    MPI_Gather(&myns, 1, MPI_UNSIGNED_LONG_LONG, allns, 1, MPI_UNSIGNED_LONG_LONG, 0,
               MPI_COMM_WORLD);
    int distinct = 0;
    if (rank == 0) {
        for (int i = 0; i < nranks; i++) {
            int seen = 0;
            for (int j = 0; j < i; j++) seen |= allns[j] == allns[i];
            distinct += !seen;
        }
        free(allns);
    }

    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        nl = strchr(lib, ',');
        if (nl) *nl = 0; /* "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4" */
        printf("mpi ranks=%d netns=%d library=\"%s\"\n", nranks, distinct, lib);
        fflush(stdout);
    }
}

static void bench_measure(struct bench *b, const char *op, size_t bytes, bench_round_fn fn,
                          void *ctx, size_t n, int spans) {
    double per = 0;
    for (long i = 0; i < b->warmup; i++) {
        double w0 = MPI_Wtime();
        double ignored;
        fn(ctx, n, b->round++, &ignored);
        double w = MPI_Wtime() - w0;
        if (i == 0 || w < per) per = w;
    }
    long r = pick_rounds(per, b->max_rounds, b->min_rounds, b->budget);
    for (long i = 0; i < r; i++) b->samples[i] = fn(ctx, n, b->round++, &b->spans[i]);
    if (rank == 0) report(op, bytes, b->samples, spans ? b->spans : NULL, r);
}

static void bench_end(struct bench *b) {
    bench_measure(b, "barrier", 0, barrier_round, NULL, 0, 0);
    free(b->spans);
    free(b->samples);
    MPI_Finalize();
}

static int bench_main(int argc, char **argv, const char *op, size_t (*parse)(const char *),
                      size_t unit, size_t min_units, bench_round_fn fn) {
    struct bench b;
    int first = bench_init(&b, &argc, &argv);
    int nops;
    size_t maxunits = min_units;
    size_t *ops = bench_operands(argc, argv, first, parse, &nops, &maxunits);

    void *buf = NULL;
    if (posix_memalign(&buf, 4096, maxunits * unit) != 0) die("out of memory");
    memset(buf, 0, maxunits * unit);

    bench_begin(&b);
    for (int i = 0; i < nops; i++)
        bench_measure(&b, op, ops[i] * unit, fn, buf, ops[i], b.span);

    free(buf);
    free(ops);
    bench_end(&b);
    return 0;
}

#endif
