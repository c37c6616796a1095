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
#define BENCH_NAME "bcast_bench"
#define BENCH_USAGE                                                                          \
    "usage: bcast_bench [-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS] [-s] SIZE...\n" \
    "  SIZE in bytes, optional K/M/G suffix (powers of 1024)\n"
#include "bench_common.h" /* options, round counts, timing, output; see its top */

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

/* One broadcast round of n bytes of ctx (the buffer); returns the slowest
 * rank's time on rank 0 (0 elsewhere) and, in *span, the time from the root's
 * start to the last rank's completion on the shared clock (see -s). */
static double bcast_round(void *ctx, size_t n, long round, double *span) {
    unsigned char *buf = ctx;
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

/* SIZE: 0..INT32_MAX bytes (an MPI count). */
static size_t parse_size(const char *s) {
    return parse_scaled(s, "size", 1, 0, "exceeds INT_MAX bytes");
}

int main(int argc, char **argv) {
    return bench_main(argc, argv, "bcast", parse_size, 1, 8, bcast_round);
}
