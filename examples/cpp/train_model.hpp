/*
 * train_model.hpp: the model, the data set and the command line of
 * examples/cpp/train.cpp, shared with its Open MPI twin
 * bench/mpi/train_mpi.cpp, so that both train exactly the same thing. It
 * knows nothing of AggBox or MPI: a program adds a communicator and one
 * allreduce per step.
 *
 * Model: softmax regression (multinomial logistic regression) of CLASSES
 * classes over FEATURES sparse features, PARAMS = FEATURES x CLASSES
 * weights; w[f * CLASSES + k] is feature f's weight for class k (no bias:
 * the classes are balanced). Loss: cross-entropy, the mean over a batch.
 * Weights start at 0 and are kept in double; gradients are computed in
 * double and travel as float (f32).
 *
 * Data: SAMPLES synthetic samples, each made from the seed and its index
 * alone (nothing is stored), like a bag of words: NNZ distinct features with
 * value +-1/sqrt(NNZ) (so |x| = 1), drawn so that about as many fall in each
 * octave [2^j, 2^(j+1)) of the feature index as in any other (frequent
 * features first, as word frequencies go). The label is the class that a
 * hidden "teacher" weight matrix, also made from the seed, scores highest;
 * the teacher weighs frequent features more. Shard r of N is samples
 * [r * SAMPLES / N, (r + 1) * SAMPLES / N); at step t rank r takes the BATCH
 * samples t * BATCH ... of its shard (wrapping around).
 *
 * Step size: with |x| = 1 the mean loss is convex and its gradient is
 * 1/2-Lipschitz (the softmax's Jacobian has norm <= 1/2), so any LR <= 4 is
 * a step that never moves two weight vectors apart; the default, 2, keeps a
 * factor of 2 from that edge. The test of this program relies on it
 * (tests/tests/train.rs).
 */
#ifndef AGGBOX_TRAIN_MODEL_HPP
#define AGGBOX_TRAIN_MODEL_HPP

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace train {

constexpr int CLASSES = 10;
constexpr int NNZ = 32;                     // features per sample
constexpr std::uint64_t SAMPLES = 1u << 20;  // the whole data set

/// splitmix64: a fast, well-mixed hash of a 64-bit integer.
inline std::uint64_t mix(std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/// What to train; the command line of both programs.
struct Options {
    long steps = 100;
    long params = 1000000;  // rounded down to a multiple of CLASSES
    long batch = 64;        // samples per rank per step
    std::uint64_t seed = 1;
    double lr = 2.0;
    bool single = false;  // train over all shards in this one process
    int ranks = 0;        // shards in --single (default $WORLD_SIZE, else 1)
    std::string weights;  // write the final weights here
};

/// Parses the command line into `o`; on a bad one prints the usage and exits with 2.
inline Options parse(int argc, char **argv, bool has_single) {
    Options o;
    auto usage = [&](const char *why) {
        std::fprintf(stderr,
                     "%s: %s\nusage: %s [--steps N] [--params P] [--batch B] [--seed S] [--lr X]%s "
                     "[--weights FILE]\n",
                     argv[0], why, argv[0], has_single ? " [--single [--ranks N]]" : "");
        std::exit(2);
    };
    auto number = [&](int &i) -> long {
        if (i + 1 >= argc) usage("an option lacks its value");
        char *end = nullptr;
        long v = std::strtol(argv[++i], &end, 10);
        if (*argv[i] == '\0' || *end != '\0' || v < 1) usage("values are whole numbers of 1 or more");
        return v;
    };
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--steps") o.steps = number(i);
        else if (a == "--params") o.params = number(i);
        else if (a == "--batch") o.batch = number(i);
        else if (a == "--seed") o.seed = static_cast<std::uint64_t>(number(i));
        else if (a == "--ranks" && has_single) o.ranks = static_cast<int>(number(i));
        else if (a == "--single" && has_single) o.single = true;
        else if (a == "--lr" || a == "--weights") {
            if (i + 1 >= argc) usage("an option lacks its value");
            if (a == "--weights") {
                o.weights = argv[++i];
                continue;
            }
            char *end = nullptr;
            o.lr = std::strtod(argv[++i], &end);
            if (*end != '\0' || !(o.lr > 0 && o.lr <= 4)) usage("--lr takes a step size in (0, 4]");
        } else usage(("unknown argument " + a).c_str());
    }
    if (o.params < 4 * NNZ * CLASSES) usage("--params is too small");
    if (o.ranks == 0) {
        const char *ws = std::getenv("WORLD_SIZE");
        o.ranks = ws ? std::atoi(ws) : 1;
        if (o.ranks < 1) o.ranks = 1;
    }
    return o;
}

/// The model and its data set.
struct Model {
    long features;  // FEATURES
    long params;    // features * CLASSES
    std::uint64_t seed;
    int octaves;  // bit length of `features`

    Model(long params_wanted, std::uint64_t seed_)
        : features(params_wanted / CLASSES), params(features * CLASSES), seed(seed_), octaves(0) {
        while ((features >> octaves) > 1) octaves++;
        octaves++;
    }

    /// The features of sample `s` (NNZ distinct indices) and their values.
    void sample(std::uint64_t s, long *feature, double *value) const {
        const double v = 1.0 / std::sqrt(static_cast<double>(NNZ));
        std::uint64_t h = mix(seed ^ mix(s));
        for (int j = 0; j < NNZ;) {
            h = mix(h);
            // Uniform over [0, features), then shifted down by 0..octaves-1
            // bits: each octave of indices gets about the same share.
            long f = static_cast<long>((h % static_cast<std::uint64_t>(features)) >> ((h >> 40) % octaves));
            bool seen = false;
            for (int i = 0; i < j; i++) seen |= feature[i] == f;
            if (seen) continue;  // draw again: features are distinct
            feature[j] = f;
            value[j] = (h >> 63) ? -v : v;
            j++;
        }
    }

    /// The class of a sample: the one the teacher scores highest. The
    /// teacher's weight of feature f for class k is uniform in [-1, 1),
    /// divided by sqrt(1 + f / 64): frequent features tell more.
    int label(const long *feature, const double *value) const {
        int best = 0;
        double best_score = -1e300;
        for (int k = 0; k < CLASSES; k++) {
            double score = 0;
            for (int j = 0; j < NNZ; j++) {
                std::uint64_t t = mix(~seed ^ mix(static_cast<std::uint64_t>(feature[j] * CLASSES + k)));
                double teacher = (static_cast<double>(t >> 11) * 0x1p-52 - 1.0) / std::sqrt(1.0 + feature[j] / 64.0);
                score += value[j] * teacher;
            }
            if (score > best_score) best = k, best_score = score;
        }
        return best;
    }

    /// Adds to `grad` (params doubles) the gradient of the mean loss over
    /// the batch of shard `shard` of `shards` at step `step`, at weights `w`;
    /// returns that mean loss.
    double gradient(const std::vector<double> &w, int shard, int shards, long step, long batch,
                    std::vector<double> &grad) const {
        const std::uint64_t per_shard = SAMPLES / static_cast<std::uint64_t>(shards);
        long feature[NNZ];
        double value[NNZ], z[CLASSES];
        double loss = 0;
        for (long i = 0; i < batch; i++) {
            std::uint64_t s = static_cast<std::uint64_t>(shard) * per_shard +
                              (static_cast<std::uint64_t>(step * batch + i) % per_shard);
            sample(s, feature, value);
            int y = label(feature, value);
            // Scores, then softmax (shifted by the largest, for range).
            double zmax = -1e300;
            for (int k = 0; k < CLASSES; k++) {
                z[k] = 0;
                for (int j = 0; j < NNZ; j++) z[k] += value[j] * w[feature[j] * CLASSES + k];
                zmax = std::fmax(zmax, z[k]);
            }
            double total = 0, zy = z[y];
            for (int k = 0; k < CLASSES; k++) total += (z[k] = std::exp(z[k] - zmax));
            loss += std::log(total) - (zy - zmax);  // -log p_y
            // d loss / d score_k = p_k - [k == y]; times x_j for weight (j, k).
            for (int k = 0; k < CLASSES; k++) {
                double d = (z[k] / total - (k == y)) / static_cast<double>(batch);
                for (int j = 0; j < NNZ; j++) grad[feature[j] * CLASSES + k] += d * value[j];
            }
        }
        return loss / static_cast<double>(batch);
    }
};

/// FNV-1a (64 bits) of the weights' bytes: equal weights, equal hash.
inline std::uint64_t checksum(const std::vector<double> &w) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = reinterpret_cast<const unsigned char *>(w.data());
    for (std::size_t i = 0; i < w.size() * sizeof(double); i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/// Writes the weights to `path` as raw doubles (this machine's byte order).
inline bool write_weights(const std::string &path, const std::vector<double> &w) {
    std::FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    bool ok = std::fwrite(w.data(), sizeof(double), w.size(), f) == w.size();
    return std::fclose(f) == 0 && ok;
}

/// Nanoseconds on CLOCK_MONOTONIC: one clock for every process of a
/// machine (the hosts of a virtual cluster share it).
inline long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace train

#endif
