/* barrier_bench: the Open MPI baseline for `aggbox bench barrier`.
 *
 *   mpirun ... barrier_bench [-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS]
 *
 * Only the barrier, measured as bcast_bench and allreduce_bench measure it
 * after their operations: WARMUP untimed rounds (default 3), then timed
 * rounds (at most ROUNDS, default 1000; fewer when ROUNDS would take longer
 * than SECONDS, default 0.5, 0 = no limit; never fewer than MIN_ROUNDS,
 * default 5), each
 *   MPI_Barrier; t0 = now(); MPI_Barrier; elapsed = now() - t0;
 *   MPI_Reduce(elapsed, MPI_MAX) to rank 0            -- untimed
 * so each sample is the slowest rank's time for one barrier after a barrier.
 * It takes no operands (-s is accepted and changes nothing).
 *
 * Output, from rank 0:
 *   mpi ranks=P netns=K library="..."
 *   mpi op=barrier bytes=0 rounds=R p50_us=X p99_us=Y
 * Percentiles are nearest-rank over the R samples. Diagnostics go to stderr.
 */
#define BENCH_NAME "barrier_bench"
#define BENCH_USAGE \
    "usage: barrier_bench [-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS]\n"
#include "bench_common.h" /* options, round counts, timing, output; see its top */

int main(int argc, char **argv) {
    struct bench b;
    int first = bench_init(&b, &argc, &argv);
    if (first != argc) usage();
    bench_begin(&b);
    bench_end(&b); /* measures and reports the barrier, then MPI_Finalize */
    return 0;
}
