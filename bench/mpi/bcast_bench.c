/* bcast_bench: the Open MPI baseline for `aggbox bench broadcast`.
 *
 *   mpirun ... bcast_bench [-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS] [-s] SIZE...
 *
 * SIZE is in bytes; a K, M or G suffix multiplies by 1024, 1024^2, 1024^3
 * (64 1K 64K 1M 64M). For each size: WARMUP untimed rounds (default 3), then
 * timed rounds: at most ROUNDS (default 1000), and fewer when the fastest
 * warm-up round says ROUNDS would take longer than SECONDS (default 0.5; 0 =
 * no limit), but never fewer than MIN_ROUNDS (default 5). Rank 0 makes that
 * choice and broadcasts it, so all ranks run the same number of rounds. The
 * time limit counts whole rounds, filling and checking included, so a big
 * size runs about SECONDS, a small one stops at ROUNDS.
 *
 * One timed round:
 *   MPI_Barrier; t0 = now(); MPI_Bcast(buf, size, MPI_BYTE, root 0);
 *   elapsed = now() - t0;                             (now(): CLOCK_MONOTONIC)
 *   MPI_Reduce(elapsed, MPI_MAX) to rank 0            -- untimed
 * so each sample is the slowest rank's time from leaving the barrier to
 * holding the data (the Reduce-MAX of each rank's own elapsed time, not the
 * time until a final barrier: a final barrier would add one more barrier's
 * latency to every sample). This is what ../shared/ARCHITECTURE.md says ("the
 * slowest rank's time, after a barrier"), and close to the OSU benchmarks
 * (which average each rank's time over the rounds, then report the max).
 *
 * Every round's payload is different: before the barrier the root fills the
 * buffer with a pattern derived from (size, round) and every other rank
 * poisons its buffer; after the timed part every rank checks every byte it
 * received and calls MPI_Abort on a mismatch. Filling and checking are outside
 * the timed region.
 *
 * -s adds a second measure of the same rounds to each bcast line,
 *   span_p50_us=A span_p99_us=B
 * the time from the root's t0 to the latest rank's completion, read on one
 * clock (the max of every rank's CLOCK_MONOTONIC at completion, minus the
 * root's t0). It counts what the per-rank measure cannot see: a rank that
 * left the barrier late finds the data already there and reports a short
 * time. Only meaningful when all ranks share a clock, as the namespaces of one
 * virtual cluster do. (Same Reduce, two doubles instead of one: no extra cost.)
 *
 * The barrier is measured once, the same way: MPI_Barrier; t0; MPI_Barrier;
 * elapsed; Reduce MAX.
 *
 * Output, from rank 0, one line per size (then the barrier line):
 *   mpi op=bcast bytes=N rounds=R p50_us=X p99_us=Y
 *   mpi op=barrier bytes=0 rounds=R p50_us=X p99_us=Y
 * Percentiles are nearest-rank over the R samples. A first line
 *   mpi ranks=P netns=K library="..."
 * says what ran: P ranks in K distinct network namespaces. Diagnostics go to stderr.
 */
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

static void die(const char *msg) {
    fprintf(stderr, "bcast_bench: rank %d: %s\n", rank, msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static void usage(void) {
    if (rank == 0)
        fprintf(stderr,
                "usage: bcast_bench [-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS] [-s] SIZE...\n"
                "  SIZE in bytes, optional K/M/G suffix (powers of 1024)\n");
    MPI_Finalize();
    exit(2);
}

static long parse_long(const char *s, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0) {
        if (rank == 0) fprintf(stderr, "bcast_bench: bad %s: %s\n", what, s);
        usage();
    }
    return v;
}

static size_t parse_size(const char *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') goto bad;
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ULL << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1ULL << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1ULL << 30, end++;
    if (*end == 'i' || *end == 'B') end++; /* allow 64KiB, 64KB */
    if (*end == 'B') end++;
    if (*end) goto bad;
    v *= mul;
    if (v > (unsigned long long)INT32_MAX) {
        if (rank == 0) fprintf(stderr, "bcast_bench: size %s exceeds INT_MAX bytes\n", s);
        usage();
    }
    return (size_t)v;
bad:
    if (rank == 0) fprintf(stderr, "bcast_bench: bad size: %s\n", s);
    usage();
    return 0;
}

/* The payload of round `round` at size `n`: a 64-bit word stream, cheap to
 * generate and check, different for every (size, round) and every offset. */
static inline uint64_t pattern_word(uint64_t seed, size_t i) {
    uint64_t x = seed + (uint64_t)i * 0x9E3779B97F4A7C15ULL;
    x ^= x >> 29;
    return x;
}

static uint64_t seed_of(size_t n, long round) {
    return ((uint64_t)n << 32) ^ (uint64_t)(round + 1) * 0xD1B54A32D192ED03ULL;
}

static void fill(unsigned char *buf, size_t n, uint64_t seed) {
    size_t words = n / 8;
    uint64_t *w = (uint64_t *)buf;
    for (size_t i = 0; i < words; i++) w[i] = pattern_word(seed, i);
    uint64_t last = pattern_word(seed, words);
    memcpy(buf + words * 8, &last, n - words * 8);
}

static void check(const unsigned char *buf, size_t n, uint64_t seed, long round) {
    size_t words = n / 8;
    const uint64_t *w = (const uint64_t *)buf;
    for (size_t i = 0; i < words; i++) {
        if (w[i] != pattern_word(seed, i)) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "broadcast of %zu bytes, round %ld: wrong data at byte offset %zu",
                     n, round, i * 8);
            die(msg);
        }
    }
    uint64_t last = pattern_word(seed, words);
    if (memcmp(buf + words * 8, &last, n - words * 8) != 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "broadcast of %zu bytes, round %ld: wrong data in the tail", n,
                 round);
        die(msg);
    }
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

/* One broadcast round; returns the slowest rank's time on rank 0 (0 elsewhere). */
/* One broadcast round; returns the slowest rank's time on rank 0 (0
 * elsewhere) and, in *span, the time from the root's start to the last rank's
 * completion on the shared clock (see -s). */
static double bcast_round(unsigned char *buf, size_t n, long round, double *span) {
    uint64_t seed = seed_of(n, round);
    if (rank == 0) fill(buf, n, seed);
    else memset(buf, 0xA5, n);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    MPI_Bcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    double t1 = now();
    if (rank != 0) check(buf, n, seed, round);
    double mine[2] = {t1 - t0, t1}, max[2] = {0, 0};
    MPI_Reduce(mine, max, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    *span = max[1] - t0; /* meaningful on rank 0, whose t0 is the root's */
    return max[0];
}

static double barrier_round(void) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    MPI_Barrier(MPI_COMM_WORLD);
    double mine = now() - t0;
    double slowest = 0;
    MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
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

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    long max_rounds = 1000, warmup = 3, min_rounds = 5;
    double budget = 0.5;
    int span = 0;
    int opt;
    opterr = 0;
    while ((opt = getopt(argc, argv, "r:w:t:m:sh")) != -1) {
        switch (opt) {
        case 'r': max_rounds = parse_long(optarg, "ROUNDS"); break;
        case 'w': warmup = parse_long(optarg, "WARMUP"); break;
        case 'm': min_rounds = parse_long(optarg, "MIN_ROUNDS"); break;
        case 's': span = 1; break;
        case 't': {
            char *end;
            budget = strtod(optarg, &end);
            if (end == optarg || *end || budget < 0) usage();
            break;
        }
        default: usage();
        }
    }
    if (max_rounds < 1) max_rounds = 1;
    if (min_rounds < 1) min_rounds = 1;
    if (min_rounds > max_rounds) min_rounds = max_rounds;
    int nsizes = argc - optind;
    if (nsizes < 1) usage();
    size_t *sizes = calloc((size_t)nsizes, sizeof *sizes);
    if (!sizes) die("out of memory");
    size_t maxsize = 8;
    for (int i = 0; i < nsizes; i++) {
        sizes[i] = parse_size(argv[optind + i]);
        if (sizes[i] > maxsize) maxsize = sizes[i];
    }

    unsigned char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, maxsize) != 0) die("out of memory");
    memset(buf, 0, maxsize);
    double *samples = calloc((size_t)max_rounds, sizeof *samples);
    double *spans = calloc((size_t)max_rounds, sizeof *spans);
    if (!samples || !spans) die("out of memory");

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

    long round = 0; /* global round counter: every round's payload differs */
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        double per = 0;
        for (long i = 0; i < warmup; i++) {
            double w0 = MPI_Wtime();
            double ignored;
            bcast_round(buf, n, round++, &ignored);
            double w = MPI_Wtime() - w0;
            if (i == 0 || w < per) per = w;
        }
        long r = pick_rounds(per, max_rounds, min_rounds, budget);
        for (long i = 0; i < r; i++) samples[i] = bcast_round(buf, n, round++, &spans[i]);
        if (rank == 0) report("bcast", n, samples, span ? spans : NULL, r);
    }

    {
        double per = 0;
        for (long i = 0; i < warmup; i++) {
            double w0 = MPI_Wtime();
            barrier_round();
            double w = MPI_Wtime() - w0;
            if (i == 0 || w < per) per = w;
        }
        long r = pick_rounds(per, max_rounds, min_rounds, budget);
        for (long i = 0; i < r; i++) samples[i] = barrier_round();
        if (rank == 0) report("barrier", 0, samples, NULL, r);
    }

    free(spans);
    free(samples);
    free(buf);
    free(sizes);
    MPI_Finalize();
    return 0;
}
