/* allreduce_bench: the Open MPI baseline for `aggbox bench allreduce`.
 *
 *   mpirun ... allreduce_bench [-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS] [-s] COUNT...
 *
 * COUNT is a number of f32 elements; a K, M or G suffix multiplies by 1024,
 * 1024^2, 1024^3 (1K 64K 1M 16M). Each is reduced with MPI_SUM, in place
 * (MPI_IN_PLACE, as AggBox's allreduce is). For each count: WARMUP untimed
 * rounds (default 3), then timed rounds: at most ROUNDS (default 1000), and
 * fewer when the fastest warm-up round says ROUNDS would take longer than
 * SECONDS (default 0.5; 0 = no limit), but never fewer than MIN_ROUNDS
 * (default 5). Rank 0 makes that choice and broadcasts it, so all ranks run
 * the same number of rounds. The time limit counts whole rounds, filling and
 * checking included, so a big count runs about SECONDS, a small one stops at
 * ROUNDS.
 *
 * One timed round (the same as bcast_bench.c's):
 *   fill buf with this rank's input of this round        -- untimed
 *   MPI_Barrier; t0 = now();
 *   MPI_Allreduce(MPI_IN_PLACE, buf, COUNT, MPI_FLOAT, MPI_SUM);
 *   elapsed = now() - t0;                             (now(): CLOCK_MONOTONIC)
 *   check every element against a plain loop over the ranks' inputs -- untimed
 *   MPI_Reduce(elapsed, MPI_MAX) to rank 0            -- untimed
 * so each sample is the slowest rank's time from leaving the barrier to
 * holding the result, as ../shared/ARCHITECTURE.md says ("the slowest rank's
 * time, after a barrier").
 *
 * Inputs: element i of rank r in round k is input(r, i, k), a small integer
 * (0..63) from a hash of the three, as a float (`aggbox bench allreduce`
 * uses the same function). Sums of up to 2^18 ranks of them are exact in
 * f32, whatever the order of the additions, so the check is exact: every
 * element must equal the sum over r of input(r, i, k), computed by a plain
 * loop; a mismatch calls MPI_Abort, naming the element.
 *
 * -s adds a second measure of the same rounds to each allreduce line,
 *   span_p50_us=A span_p99_us=B
 * the time from the earliest rank's t0 to the latest rank's completion, read
 * on one clock (the max of every rank's CLOCK_MONOTONIC at completion minus
 * the min of their t0s). Only meaningful when all ranks share a clock, as
 * the namespaces of one virtual cluster do. (The same Reduce, three doubles
 * instead of one: no extra cost.)
 *
 * The barrier is measured once, as in bcast_bench.c: MPI_Barrier; t0;
 * MPI_Barrier; elapsed; Reduce MAX.
 *
 * Output, from rank 0, one line per count (then the barrier line):
 *   mpi op=allreduce bytes=N rounds=R p50_us=X p99_us=Y     (N = 4 * COUNT)
 *   mpi op=barrier bytes=0 rounds=R p50_us=X p99_us=Y
 * Percentiles are nearest-rank over the R samples. A first line
 *   mpi ranks=P netns=K library="..."
 * says what ran: P ranks in K distinct network namespaces. Diagnostics go to stderr.
 */
#define BENCH_NAME "allreduce_bench"
#define BENCH_USAGE                                                                               \
    "usage: allreduce_bench [-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS] [-s] COUNT...\n" \
    "  COUNT in f32 elements, optional K/M/G suffix (powers of 1024)\n"
#include "bench_common.h" /* options, round counts, timing, output; see its top */

/* Element i of rank r's input in round k: 0..63, from a hash of (r, i, k).
 * Keep in step with `allreduce_input` in cli/src/bench.rs. */
static inline float input(uint32_t r, uint32_t i, uint32_t k) {
    uint32_t h = (i * 0x9E3779B1u) ^ (r * 0x85EBCA77u + k * 0xC2B2AE3Du);
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    return (float)(h >> 26);
}

static void fill(float *buf, size_t n, long round) {
    for (size_t i = 0; i < n; i++) buf[i] = input((uint32_t)rank, (uint32_t)i, (uint32_t)round);
}

/* The plain loop: element i must be the sum over every rank of its input. */
static void check(const float *buf, size_t n, long round) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++) want += input((uint32_t)r, (uint32_t)i, (uint32_t)round);
        bad += buf[i] != want;
    }
    if (!bad) return;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++) want += input((uint32_t)r, (uint32_t)i, (uint32_t)round);
        if (buf[i] != want) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "allreduce of %zu f32, round %ld: element %zu is %g, not %g (%zu elements wrong)",
                     n, round, i, (double)buf[i], (double)want, bad);
            die(msg);
        }
    }
}

/* One allreduce round of n f32 of ctx (the buffer); returns the slowest
 * rank's time on rank 0 (0 elsewhere) and, in *span, the time from the
 * earliest rank's start to the last rank's completion on the shared clock
 * (see -s). */
static double allreduce_round(void *ctx, size_t n, long round, double *span) {
    float *buf = ctx;
    fill(buf, n, round);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t1 = now();
    check(buf, n, round);
    /* MAX of -t0 is minus the earliest start. */
    double mine[3] = {t1 - t0, t1, -t0}, max[3] = {0, 0, 0};
    MPI_Reduce(mine, max, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    *span = max[1] + max[2];
    return max[0];
}

/* COUNT: 1..INT32_MAX elements (an MPI count). */
static size_t parse_count(const char *s) {
    return parse_scaled(s, "count", 0, 1, "is not in 1..INT_MAX");
}

int main(int argc, char **argv) {
    return bench_main(argc, argv, "allreduce", parse_count, sizeof(float), 1, allreduce_round);
}
