/* train_mpi: the Open MPI baseline for `aggbox bench train`:
 * examples/cpp/train.cpp with MPI_Allreduce in place of AggBox.
 *
 *   mpirun ... train_mpi [--steps N] [--params P] [--batch B] [--seed S] [--lr X] [--weights FILE]
 *
 * The same model, data, shards, steps and options (examples/cpp/
 * train_model.hpp, which both include), the same sampling: a first
 * MPI_Barrier, then each step computes this rank's shard's gradient,
 * rounds it to f32, MPI_Allreduce(MPI_IN_PLACE, MPI_FLOAT, MPI_SUM),
 * divides by the ranks (AggBox's AVG divides too) and takes the SGD step;
 * each rank times its own steps on CLOCK_MONOTONIC. Only the allreduce
 * differs: MPI sums the floats, AggBox sums them quantized (docs/
 * ALLREDUCE.md), so the weights agree to that bound, not bit for bit.
 *
 * Output, all from rank 0 once training is over (MPI_Gather of every rank's
 * per-step figures, untimed), in train.cpp's format behind "mpi ":
 *   mpi ranks=P netns=K library="Open MPI v4.1.4"
 *   mpi train rank=R ranks=N datapath=mpi params=... (once per rank)
 *   mpi step=T rank=R loss=L time_us=X end_ns=E gmax=G   (per rank and step)
 *   mpi done rank=R steps=S start_ns=E total_s=X weights_fnv1a=0x...
 * --weights FILE writes rank 0's final weights. Diagnostics go to stderr.
 */
// The C API only: Open MPI's deprecated C++ bindings do not compile cleanly with -Wextra.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "train_model.hpp"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const train::Options o = train::parse(argc, argv, /*has_single=*/false);
    const train::Model model(o.params, o.seed);
    const std::size_t n = static_cast<std::size_t>(model.params);
    std::vector<double> w(n, 0.0), grad(n);
    std::vector<float> g(n);
    // Per step: loss, time_us, end_ns, gmax (end_ns < 2^53: exact as a double).
    std::vector<double> mine(4 * static_cast<std::size_t>(o.steps));

    MPI_Barrier(MPI_COMM_WORLD);
    const long long start = train::now_ns();
    for (long step = 0; step < o.steps; step++) {
        const long long t0 = train::now_ns();
        std::fill(grad.begin(), grad.end(), 0.0);
        double loss = model.gradient(w, rank, ranks, step, o.batch, grad);
        float gmax = 0;
        for (std::size_t i = 0; i < n; i++) {
            g[i] = static_cast<float>(grad[i]);
            gmax = std::fmax(gmax, std::fabs(g[i]));
        }
        MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (std::size_t i = 0; i < n; i++) g[i] /= static_cast<float>(ranks);
        for (std::size_t i = 0; i < n; i++) w[i] -= o.lr * static_cast<double>(g[i]);
        const long long t1 = train::now_ns();
        double *s = &mine[4 * static_cast<std::size_t>(step)];
        s[0] = loss, s[1] = (t1 - t0) / 1e3, s[2] = static_cast<double>(t1), s[3] = gmax;
    }
    const double total_s = (train::now_ns() - start) / 1e9;

    // Untimed: everything to rank 0, which prints it.
    std::vector<double> all(rank == 0 ? mine.size() * static_cast<std::size_t>(ranks) : 0);
    MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(), static_cast<int>(mine.size()),
               MPI_DOUBLE, 0, MPI_COMM_WORLD);
    struct stat st;
    double tail[4] = {static_cast<double>(start), total_s, 0, 0};
    tail[2] = stat("/proc/self/ns/net", &st) == 0 ? static_cast<double>(st.st_ino) : 0;
    std::uint64_t hash = train::checksum(w);
    std::memcpy(&tail[3], &hash, sizeof hash);
    std::vector<double> tails(rank == 0 ? 4 * static_cast<std::size_t>(ranks) : 0);
    MPI_Gather(tail, 4, MPI_DOUBLE, tails.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        std::vector<double> netns;
        for (int r = 0; r < ranks; r++) netns.push_back(tails[4 * r + 2]);
        std::sort(netns.begin(), netns.end());
        long distinct = std::unique(netns.begin(), netns.end()) - netns.begin();
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(lib, &len);
        lib[std::strcspn(lib, ",\n")] = '\0';  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
        std::printf("mpi ranks=%d netns=%ld library=\"%s\"\n", ranks, distinct, lib);
        for (int r = 0; r < ranks; r++) {
            std::printf("mpi train rank=%d ranks=%d datapath=mpi params=%ld features=%ld classes=%d batch=%ld "
                        "steps=%ld lr=%g seed=%" PRIu64 "\n",
                        r, ranks, model.params, model.features, train::CLASSES, o.batch, o.steps, o.lr, o.seed);
            for (long step = 0; step < o.steps; step++) {
                const double *s = &all[(static_cast<std::size_t>(r) * o.steps + step) * 4];
                std::printf("mpi step=%ld rank=%d loss=%.6f time_us=%.1f end_ns=%.0f gmax=%.9g\n", step, r, s[0],
                            s[1], s[2], s[3]);
            }
            std::uint64_t h;
            std::memcpy(&h, &tails[4 * r + 3], sizeof h);
            std::printf("mpi done rank=%d steps=%ld start_ns=%.0f total_s=%.3f weights_fnv1a=0x%016" PRIx64 "\n", r,
                        o.steps, tails[4 * r], tails[4 * r + 1], h);
        }
        std::fflush(stdout);
        if (!o.weights.empty() && !train::write_weights(o.weights, w)) std::perror(o.weights.c_str());
    }
    MPI_Finalize();
    return 0;
}
