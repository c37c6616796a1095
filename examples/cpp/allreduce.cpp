/*
 * allreduce.cpp: the reduction collectives with the C++ wrapper
 * bindings/cpp/aggbox.hpp, on std::vector buffers: join a group from the
 * environment, then for each size allreduce (typed, in place and not),
 * start an asynchronous average and wait for it, reduce to the last rank,
 * reduce-scatter and allgather, checking every element.
 *
 *   RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 ./allreduce 1000 65536   # on each host
 *
 * Arguments: the sizes in elements (default 1000). Takes the environment of
 * examples/c/allreduce.c and prints one line per size on stdout:
 *   rank=R size=N datapath=kernel|user count=C checks=K errors=E
 * On an error of the library (an aggbox::Error) it prints the status and
 * the message on stderr and exits with 1; a wrong element also makes it
 * exit with 1. Build it, after cargo build -p aggbox-ffi, with
 *
 *   c++ -std=c++17 -I include -I bindings/cpp examples/cpp/allreduce.cpp \
 *       -L target/debug -Wl,-rpath,target/debug -laggbox -o allreduce
 */
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "aggbox.hpp"

namespace {

/// Rank `rank`'s input at index `i`: small integers, so that every sum of
/// them (as int64_t or as double) is exact on every rank.
std::int64_t input(int rank, std::size_t i) {
    return static_cast<std::int64_t>((i * 7919 + static_cast<std::size_t>(rank) * 104729) % 1000003) - 500000;
}

/// Counts the elements of `got` that are not `want(i)`, describing the first.
template <typename T, typename Want>
long mismatches(const char *what, const std::vector<T> &got, Want want) {
    long wrong = 0;
    for (std::size_t i = 0; i < got.size(); i++) {
        if (got[i] != want(i)) {
            if (wrong++ == 0) {
                std::fprintf(stderr, "allreduce: %s: element %zu of %zu is wrong\n", what, i, got.size());
            }
        }
    }
    return wrong;
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<std::size_t> counts;
    for (int a = 1; a < argc; a++) {
        char *end = nullptr;
        unsigned long long value = std::strtoull(argv[a], &end, 10);
        if (end == argv[a] || *end != '\0' || argv[a][0] == '-' || value > (1ull << 32)) {
            std::fprintf(stderr, "usage: %s [size in elements ...]: %s is not a size\n", argv[0], argv[a]);
            return 2;
        }
        counts.push_back(static_cast<std::size_t>(value));
    }
    if (counts.empty()) {
        counts.push_back(1000);
    }
    long errors = 0;
    try {
        auto comm = aggbox::Communicator::from_env();
        const int rank = comm.rank(), size = comm.size();
        const char *datapath = comm.datapath() == AGGBOX_DATAPATH_KERNEL ? "kernel" : "user";
        auto sum = [size](std::size_t i) {
            std::int64_t s = 0;
            for (int r = 0; r < size; r++) {
                s += input(r, i);
            }
            return s;
        };
        for (std::size_t count : counts) {
            long before = errors;
            std::vector<std::int64_t> mine(count);
            for (std::size_t i = 0; i < count; i++) {
                mine[i] = input(rank, i);
            }

            // In place, typed: the element type gives AGGBOX_DTYPE_I64.
            std::vector<std::int64_t> total = mine;
            comm.allreduce(total.data(), count, AGGBOX_OP_SUM);
            errors += mismatches("allreduce i64 sum", total, sum);

            // From one buffer into another.
            std::vector<std::int64_t> smallest(count);
            comm.allreduce(mine.data(), smallest.data(), count, AGGBOX_OP_MIN);
            errors += mismatches("allreduce i64 min", smallest, [&](std::size_t i) {
                std::int64_t m = input(0, i);
                for (int r = 1; r < size; r++) {
                    m = input(r, i) < m ? input(r, i) : m;
                }
                return m;
            });

            // Asynchronous: the vector is the library's until wait().
            std::vector<double> mean(mine.begin(), mine.end());
            aggbox::Request request = comm.iallreduce(mean.data(), count, AGGBOX_OP_AVG);
            request.wait();
            errors += mismatches("iallreduce f64 avg", mean,
                                 [&](std::size_t i) { return static_cast<double>(sum(i)) / size; });

            // Reduce to the last rank: recvbuf only matters there.
            std::vector<std::int64_t> at_root(rank == size - 1 ? count : 0);
            comm.reduce(mine.data(), rank == size - 1 ? at_root.data() : nullptr, count, AGGBOX_OP_MAX, size - 1);
            errors += mismatches("reduce i64 max", at_root, [&](std::size_t i) {
                std::int64_t m = input(0, i);
                for (int r = 1; r < size; r++) {
                    m = input(r, i) > m ? input(r, i) : m;
                }
                return m;
            });

            // Reduce-scatter blocks of count / size, then gather them back.
            std::size_t block = count / static_cast<std::size_t>(size);
            std::vector<std::int64_t> part(block);
            comm.reduce_scatter(mine.data(), part.data(), block, AGGBOX_OP_SUM);
            errors += mismatches("reduce-scatter i64 sum", part,
                                 [&](std::size_t k) { return sum(static_cast<std::size_t>(rank) * block + k); });
            std::vector<std::int64_t> whole(block * static_cast<std::size_t>(size));
            comm.allgather(part.data(), whole.data(), block);
            errors += mismatches("allgather i64", whole, sum);

            std::printf("rank=%d size=%d datapath=%s count=%zu checks=6 errors=%ld\n", rank, size, datapath, count,
                        errors - before);
            std::fflush(stdout);
        }
    } catch (const aggbox::Error &e) {
        std::fprintf(stderr, "allreduce: error (%s): %s\n", e.status_string(), e.what());
        return 1;
    }
    return errors == 0 ? 0 : 1;
}
