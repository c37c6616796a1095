/*
 * barrier.cpp: examples/c/barrier.c with the C++ wrapper
 * bindings/cpp/aggbox.hpp: join a group from the environment and time N
 * barriers.
 *
 *   RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 ./barrier 1000   # on each host
 *
 * Takes the same environment and prints the same line on stdout (wrapped
 * here):
 *   rank=R size=S datapath=kernel|user barriers=N total_us=T per_barrier_us=X
 *     retransmits=N xdp_accepted=N
 * On any error it prints the status and the library's message on stderr and
 * exits with 1. Build it, after cargo build -p aggbox-ffi, with
 *
 *   c++ -std=c++17 -I include -I bindings/cpp examples/cpp/barrier.cpp \
 *       -L target/debug -Wl,-rpath,target/debug -laggbox -o barrier
 */
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "aggbox.hpp"

int main(int argc, char **argv) {
    long n = 1000;
    char *end = nullptr;
    if (argc > 2 || (argc == 2 && ((n = std::strtol(argv[1], &end, 10)) < 1 || *end != '\0'))) {
        std::fprintf(stderr, "usage: %s [number of barriers, 1 or more, default 1000]\n", argv[0]);
        return 2;
    }
    try {
        auto comm = aggbox::Communicator::from_env();
        const char *datapath = comm.datapath() == AGGBOX_DATAPATH_KERNEL ? "kernel" : "user";
        std::string reason = comm.datapath_reason();
        if (!reason.empty()) {
            std::fprintf(stderr, "aggbox: datapath auto fell back: %s\n", reason.c_str());
        }

        comm.barrier();  // so that every rank starts timing together
        auto start = std::chrono::steady_clock::now();
        for (long i = 0; i < n; i++) {
            comm.barrier();
        }
        double total_us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();

        aggbox_stats stats = comm.stats();
        std::printf("rank=%d size=%d datapath=%s barriers=%ld total_us=%.0f per_barrier_us=%.2f"
                    " retransmits=%" PRIu64 " xdp_accepted=%" PRIu64 "\n",
                    comm.rank(), comm.size(), datapath, n, total_us, total_us / static_cast<double>(n),
                    stats.retransmits, stats.kernel[AGGBOX_PROG_XDP_INGRESS][AGGBOX_STAT_ACCEPTED]);
        return 0;
    } catch (const aggbox::Error &e) {
        std::fprintf(stderr, "barrier: error (%s): %s\n", e.status_string(), e.what());
        return 1;
    }
}
