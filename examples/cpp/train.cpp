/*
 * train.cpp: data-parallel training with the C++ wrapper
 * bindings/cpp/aggbox.hpp. Every rank holds the whole model, computes the
 * gradient on its own shard of the data, and the ranks average their
 * gradients with one allreduce (f32, AGGBOX_OP_AVG) per step; then each
 * rank takes the same plain SGD step, so the weights stay the same on every
 * rank. The model (softmax regression of 10 classes over sparse features,
 * 1 M parameters by default) and the synthetic data set are in
 * train_model.hpp.
 *
 *   RANK=0 WORLD_SIZE=4 MASTER_ADDR=10.77.0.1 ./train --steps 100   # on each host
 *   ./train --single --ranks 4 --steps 100      # the same, in one process
 *
 * Options: --steps N (100), --params P (1000000), --batch B (samples per
 * rank per step, 64), --seed S (1), --lr X (step size, 2), --weights FILE
 * (write the final weights there: PARAMS doubles, this machine's byte
 * order), --single (no communicator: compute every shard's gradient here and
 * average them, the reference a distributed run is checked against) with
 * --ranks N (shards; default $WORLD_SIZE, else 1).
 *
 * Prints on stdout, for people and scripts:
 *   train rank=R ranks=N datapath=kernel|user|single params=P features=F classes=K batch=B steps=S lr=X seed=S
 *   step=T rank=R loss=L time_us=X end_ns=E gmax=G     (one per step)
 *   done rank=R steps=S start_ns=E total_s=X weights_fnv1a=0x...
 * loss: the mean loss of this rank's batch before the step (--single: of
 * every shard's); time_us: the step, gradient + allreduce + update; end_ns
 * and start_ns (after a first barrier): CLOCK_MONOTONIC, which the hosts of
 * a virtual cluster share; gmax: the largest |gradient element| this rank
 * sent (--single: of all shards); weights_fnv1a: a hash of the final
 * weights, equal on every rank. On an error of the library it prints the
 * status and the message on stderr and exits with 1.
 *
 * Build (after cargo build -p aggbox-ffi): make -C examples/cpp, or
 *
 *   c++ -std=c++17 -O2 -I include -I bindings/cpp examples/cpp/train.cpp \
 *       -L target/debug -Wl,-rpath,target/debug -laggbox -o train
 */
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "aggbox.hpp"
#include "train_model.hpp"

int main(int argc, char **argv) {
    const train::Options o = train::parse(argc, argv, /*has_single=*/true);
    const train::Model model(o.params, o.seed);
    const std::size_t n = static_cast<std::size_t>(model.params);
    std::vector<double> w(n, 0.0);  // the weights, the same on every rank
    std::vector<double> grad(n);    // this rank's gradient
    std::vector<float> g(n);        // what travels: the gradient as f32
    try {
        // --single has no communicator: it plays every rank itself.
        std::optional<aggbox::Communicator> comm;
        int rank = 0, ranks = o.ranks;
        const char *datapath = "single";
        if (!o.single) {
            comm.emplace(aggbox::Communicator::from_env());
            rank = comm->rank(), ranks = comm->size();
            datapath = comm->datapath() == AGGBOX_DATAPATH_KERNEL ? "kernel" : "user";
        }
        std::printf("train rank=%d ranks=%d datapath=%s params=%ld features=%ld classes=%d batch=%ld steps=%ld "
                    "lr=%g seed=%" PRIu64 "\n",
                    rank, ranks, datapath, model.params, model.features, train::CLASSES, o.batch, o.steps, o.lr,
                    o.seed);
        std::vector<double> sum(o.single ? n : 0);  // --single: the shards' f32 gradients, added up

        if (comm) comm->barrier();  // start together
        const long long start = train::now_ns();
        for (long step = 0; step < o.steps; step++) {
            const long long t0 = train::now_ns();
            double loss = 0;
            float gmax = 0;
            if (comm) {
                // Our shard's gradient, as f32, averaged over the ranks.
                std::fill(grad.begin(), grad.end(), 0.0);
                loss = model.gradient(w, rank, ranks, step, o.batch, grad);
                for (std::size_t i = 0; i < n; i++) {
                    g[i] = static_cast<float>(grad[i]);
                    gmax = std::fmax(gmax, std::fabs(g[i]));
                }
                comm->allreduce(g.data(), n, AGGBOX_OP_AVG);
            } else {
                // Every shard's gradient as f32, as each rank would send it,
                // averaged here in double and rounded to f32 once.
                std::fill(sum.begin(), sum.end(), 0.0);
                for (int r = 0; r < ranks; r++) {
                    std::fill(grad.begin(), grad.end(), 0.0);
                    loss += model.gradient(w, r, ranks, step, o.batch, grad) / ranks;
                    for (std::size_t i = 0; i < n; i++) {
                        float gi = static_cast<float>(grad[i]);
                        gmax = std::fmax(gmax, std::fabs(gi));
                        sum[i] += gi;
                    }
                }
                for (std::size_t i = 0; i < n; i++) g[i] = static_cast<float>(sum[i] / ranks);
            }
            // Plain SGD.
            for (std::size_t i = 0; i < n; i++) w[i] -= o.lr * static_cast<double>(g[i]);
            const long long t1 = train::now_ns();
            std::printf("step=%ld rank=%d loss=%.6f time_us=%.1f end_ns=%lld gmax=%.9g\n", step, rank, loss,
                        (t1 - t0) / 1e3, t1, static_cast<double>(gmax));
        }
        std::printf("done rank=%d steps=%ld start_ns=%lld total_s=%.3f weights_fnv1a=0x%016" PRIx64 "\n", rank,
                    o.steps, start, (train::now_ns() - start) / 1e9, train::checksum(w));
        std::fflush(stdout);
        if (!o.weights.empty() && !train::write_weights(o.weights, w)) {
            std::perror(o.weights.c_str());
            return 1;
        }
        return 0;
    } catch (const aggbox::Error &e) {
        std::fprintf(stderr, "train: error (%s): %s\n", e.status_string(), e.what());
        return 1;
    }
}
