/* gloo_bench: the Gloo baseline for `aggbox bench broadcast|allreduce|barrier`,
 * measured as bench/mpi measures Open MPI.
 *
 *   RANK=R WORLD_SIZE=N GLOO_STORE=DIR [GLOO_IFACE=eth0] \
 *     gloo_bench OP [-r ROUNDS] [-w WARMUP] [-t SECONDS] [-m MIN_ROUNDS] [-s] [SIZE...]
 *
 * One process per rank (bench/gloo/run.sh starts them, one per host of a
 * virtual cluster). Rendezvous: Gloo's FileStore in DIR (the namespaces share
 * the file system), then a full mesh of Gloo's TCP transport on GLOO_IFACE.
 * OP is the collective, with Gloo's own (new-style) functions, the ones
 * PyTorch's Gloo backend calls:
 *   bcast      gloo::broadcast from root 0; SIZE in bytes (64 1K 64K 1M 64M)
 *   allreduce  gloo::allreduce of f32 with gloo::sum<float>, in place; SIZE
 *              in f32 elements (1K 64K 1M 16M)
 *   barrier    gloo::barrier; no SIZE
 * SIZE takes a K, M or G suffix (powers of 1024).
 *
 * For each size: WARMUP untimed rounds (default 3), then timed rounds: at
 * most ROUNDS (default 1000), fewer when the fastest warm-up round says
 * ROUNDS would take longer than SECONDS (default 0.5; 0 = no limit), never
 * fewer than MIN_ROUNDS (default 5); rank 0 decides, every rank learns it.
 * One timed round, as bench/mpi's:
 *   gloo::barrier; t0 = now(); OP; elapsed = now() - t0   (now(): CLOCK_MONOTONIC)
 *   then, untimed, an allreduce MAX of (elapsed, end, -start) over the ranks
 * so a sample is the slowest rank's time after a barrier; -s adds the span:
 * bcast, the root's start to the last rank's end; allreduce, the earliest
 * start to the latest end (one clock: the namespaces share it).
 *
 * Every round's data differ and are checked: a broadcast's bytes follow a
 * pattern of (size, round), an allreduce's inputs are small integers from a
 * hash of (rank, element, round) (allreduce_input in cli/src/bench.rs), whose
 * sums are exact in f32 in any order. A mismatch exits with status 3.
 *
 * Output, from rank 0, on stdout (the format of bench/mpi's lines):
 *   gloo ranks=N library="Gloo"
 *   gloo op=OP bytes=B rounds=R p50_us=X p99_us=Y [span_p50_us=A span_p99_us=B]
 * Percentiles are nearest-rank. Diagnostics go to stderr.
 */
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

int rank_ = 0, size_ = 1;

[[noreturn]] void usage() {
    if (rank_ == 0)
        std::fprintf(stderr,
                     "usage: gloo_bench bcast|allreduce|barrier [-r ROUNDS] [-w WARMUP] [-t SECONDS] "
                     "[-m MIN_ROUNDS] [-s] [SIZE...]\n"
                     "  environment: RANK, WORLD_SIZE, GLOO_STORE (a directory), GLOO_IFACE (eth0)\n");
    std::exit(2);
}

[[noreturn]] void die(const std::string& msg, int status = 1) {
    std::fprintf(stderr, "gloo_bench: rank %d: %s\n", rank_, msg.c_str());
    std::exit(status);
}

long env_long(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) die(std::string(name) + " is not set");
    char* end;
    long x = std::strtol(v, &end, 10);
    if (*end || x < 0) die(std::string("bad ") + name + ": " + v);
    return x;
}

size_t parse_scaled(const char* s) {
    char* end;
    unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s || s[0] == '-') usage();
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ULL << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1ULL << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1ULL << 30, end++;
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (*end) usage();
    return static_cast<size_t>(v * mul);
}

double now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/* Nearest-rank percentile of sorted v. */
double pct(const std::vector<double>& v, double p) {
    long n = static_cast<long>(v.size());
    long k = static_cast<long>(std::ceil(p * static_cast<double>(n))) - 1;
    k = std::max(0L, std::min(k, n - 1));
    return v[static_cast<size_t>(k)];
}

using Ctx = std::shared_ptr<gloo::Context>;

void barrier(const Ctx& ctx) {
    gloo::BarrierOptions opts(ctx);
    gloo::barrier(opts);
}

/* The element-wise MAX of v over the ranks, in place. */
void max_over_ranks(const Ctx& ctx, std::vector<double>& v) {
    gloo::AllreduceOptions opts(ctx);
    opts.setOutput(v.data(), v.size());
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
    gloo::allreduce(opts);
}

void broadcast_long(const Ctx& ctx, long* v) {
    gloo::BroadcastOptions opts(ctx);
    opts.setRoot(0);
    opts.setOutput(v, 1);
    gloo::broadcast(opts);
}

/* Broadcast payload: one byte per offset, different per (size, round). */
inline unsigned char pattern(size_t n, long round, size_t i) {
    uint64_t x = (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL) ^ (static_cast<uint64_t>(n) << 32) ^
                 (static_cast<uint64_t>(round + 1) * 0xD1B54A32D192ED03ULL);
    x ^= x >> 29;
    return static_cast<unsigned char>(x);
}

/* allreduce_input of cli/src/bench.rs: a small integer (0..63). */
inline float input(uint32_t r, uint32_t i, uint32_t round) {
    uint32_t h = (i * 0x9E3779B1u) ^ (r * 0x85EBCA77u + round * 0xC2B2AE3Du);
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    return static_cast<float>(h >> 26);
}

struct Bench {
    std::string op;
    long max_rounds = 1000, warmup = 3, min_rounds = 5;
    double budget = 0.5;
    bool spans = false;
    long round = 0;
};

/* One round of OP on n units; returns (this rank's elapsed, start, end). */
struct Sample {
    double elapsed, start, end;
};

Sample run_round(const Ctx& ctx, Bench& b, std::vector<unsigned char>& bytes, std::vector<float>& floats,
                 size_t n) {
    long round = b.round++;
    if (b.op == "bcast") {
        if (rank_ == 0)
            for (size_t i = 0; i < n; i++) bytes[i] = pattern(n, round, i);
        else
            std::memset(bytes.data(), 0xA5, n);
    } else if (b.op == "allreduce") {
        for (size_t i = 0; i < n; i++) floats[i] = input(rank_, static_cast<uint32_t>(i), static_cast<uint32_t>(round));
    }
    barrier(ctx);
    double t0 = now();
    if (b.op == "bcast") {
        gloo::BroadcastOptions opts(ctx);
        opts.setRoot(0);
        if (rank_ == 0) opts.setInput(bytes.data(), n);
        opts.setOutput(bytes.data(), n);
        gloo::broadcast(opts);
    } else if (b.op == "allreduce") {
        gloo::AllreduceOptions opts(ctx);
        opts.setOutput(floats.data(), n);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        gloo::allreduce(opts);
    } else {
        barrier(ctx);
    }
    double t1 = now();
    if (b.op == "bcast" && rank_ != 0) {
        for (size_t i = 0; i < n; i++)
            if (bytes[i] != pattern(n, round, i))
                die("broadcast of " + std::to_string(n) + " bytes, round " + std::to_string(round) +
                        ": wrong data at offset " + std::to_string(i),
                    3);
    } else if (b.op == "allreduce") {
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < size_; r++) want += input(r, static_cast<uint32_t>(i), static_cast<uint32_t>(round));
            if (floats[i] != want)
                die("allreduce of " + std::to_string(n) + " f32, round " + std::to_string(round) + ": element " +
                        std::to_string(i) + " is " + std::to_string(floats[i]) + ", not " + std::to_string(want),
                    3);
        }
    }
    return {t1 - t0, t0, t1};
}

void measure(const Ctx& ctx, Bench& b, size_t n, size_t unit) {
    std::vector<unsigned char> bytes(b.op == "bcast" ? std::max<size_t>(n, 1) : 1);
    std::vector<float> floats(b.op == "allreduce" ? std::max<size_t>(n, 1) : 1);
    double per = 0;
    for (long i = 0; i < b.warmup; i++) {
        double w0 = now();
        run_round(ctx, b, bytes, floats, n);
        double w = now() - w0;
        if (i == 0 || w < per) per = w;
    }
    long rounds = b.max_rounds;
    if (rank_ == 0 && b.budget > 0 && per > 0 && per * static_cast<double>(rounds) > b.budget)
        rounds = std::max(b.min_rounds, std::min(b.max_rounds, static_cast<long>(b.budget / per)));
    broadcast_long(ctx, &rounds);
    std::vector<double> samples, spans;
    for (long i = 0; i < rounds; i++) {
        Sample s = run_round(ctx, b, bytes, floats, n);
        // The slowest rank's time, the latest end, the earliest start.
        std::vector<double> v = {s.elapsed, s.end, -s.start};
        double root_start = s.start;
        max_over_ranks(ctx, v);
        samples.push_back(v[0]);
        spans.push_back(v[1] - (b.op == "bcast" ? root_start : -v[2]));
    }
    if (rank_ != 0) return;
    std::sort(samples.begin(), samples.end());
    std::sort(spans.begin(), spans.end());
    std::printf("gloo op=%s bytes=%zu rounds=%ld p50_us=%.1f p99_us=%.1f", b.op.c_str(), n * unit, rounds,
                pct(samples, 0.5) * 1e6, pct(samples, 0.99) * 1e6);
    if (b.spans && b.op != "barrier")
        std::printf(" span_p50_us=%.1f span_p99_us=%.1f", pct(spans, 0.5) * 1e6, pct(spans, 0.99) * 1e6);
    std::printf("\n");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    rank_ = static_cast<int>(env_long("RANK"));
    size_ = static_cast<int>(env_long("WORLD_SIZE"));
    if (size_ < 1 || rank_ >= size_) die("RANK must be below WORLD_SIZE");
    const char* store_dir = std::getenv("GLOO_STORE");
    if (!store_dir || !*store_dir) die("GLOO_STORE is not set");
    const char* iface = std::getenv("GLOO_IFACE");
    if (argc < 2) usage();
    Bench b;
    b.op = argv[1];
    if (b.op != "bcast" && b.op != "allreduce" && b.op != "barrier") usage();
    int opt;
    optind = 2;
    while ((opt = getopt(argc, argv, "r:w:t:m:sh")) != -1) {
        switch (opt) {
        case 'r': b.max_rounds = std::max(1L, std::atol(optarg)); break;
        case 'w': b.warmup = std::max(0L, std::atol(optarg)); break;
        case 'm': b.min_rounds = std::max(1L, std::atol(optarg)); break;
        case 't': b.budget = std::atof(optarg); break;
        case 's': b.spans = true; break;
        default: usage();
        }
    }
    b.min_rounds = std::min(b.min_rounds, b.max_rounds);
    std::vector<size_t> sizes;
    for (int i = optind; i < argc; i++) sizes.push_back(parse_scaled(argv[i]));
    if (b.op == "barrier" ? !sizes.empty() : sizes.empty()) usage();
    if (b.op == "barrier") sizes.push_back(0);

    try {
        gloo::transport::tcp::attr attr;
        attr.iface = iface && *iface ? iface : "eth0";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore store(store_dir);
        auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
        context->setTimeout(std::chrono::seconds(120));
        context->connectFullMesh(store, dev);
        Ctx ctx = context;
        if (rank_ == 0) {
            std::printf("gloo ranks=%d library=\"Gloo\"\n", size_);
            std::fflush(stdout);
        }
        for (size_t n : sizes) measure(ctx, b, n, b.op == "allreduce" ? sizeof(float) : 1);
        barrier(ctx);
    } catch (const std::exception& e) {
        die(std::string("gloo: ") + e.what());
    }
    return 0;
}
