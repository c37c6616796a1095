/*
 * aggbox.hpp: a header-only C++17 wrapper of the C API in aggbox.h.
 * SPDX-License-Identifier: Apache-2.0
 *
 *   #include "aggbox.hpp"
 *
 *   aggbox::Communicator comm = aggbox::Communicator::from_env();
 *   comm.barrier();                       // throws aggbox::Error on failure
 *
 * Compile with -std=c++17 (or later), -I<aggbox>/include and
 * -I<aggbox>/bindings/cpp, and link with -laggbox. Everything here is inline
 * and calls only the functions of aggbox.h, so the wrapper adds no ABI of its
 * own: a program keeps working with any libaggbox that has the C ABI it was
 * built against.
 *
 * Errors. Every call that fails in C throws aggbox::Error, which carries the
 * aggbox_status and the library's message for it (aggbox_last_error() of the
 * calling thread, read at once). The getters that cannot fail in C
 * (rank, size, datapath) do not throw.
 *
 * Threads. As in C: a Communicator may be used from any thread, by one
 * thread at a time; a call made while another thread is inside a call on
 * the same communicator throws aggbox::Error with
 * AGGBOX_ERR_INVALID_ARGUMENT. rank(), size(), datapath() and
 * datapath_reason() may be called at any time.
 */
#ifndef AGGBOX_HPP
#define AGGBOX_HPP

#if defined(_MSVC_LANG)
#if _MSVC_LANG < 201703L
#error "aggbox.hpp needs C++17 or later (/std:c++17)"
#endif
#elif __cplusplus < 201703L
#error "aggbox.hpp needs C++17 or later (-std=c++17)"
#endif

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include "aggbox.h"

namespace aggbox {

/// The message of the last failed call of the C API on this thread, as
/// aggbox_last_error() gives it ("" if none has failed).
inline std::string last_error() {
    std::string message(aggbox_last_error(nullptr, 0) + 1, '\0');
    std::size_t len = aggbox_last_error(&message[0], message.size());
    message.resize(len < message.size() ? len : message.size() - 1);
    return message;
}

/// A call of the C API failed: its status and the library's message, which
/// names the function and says what went wrong (what() returns it, e.g.
/// "aggbox_comm_init: invalid argument: config->world_size is 0, ...").
class Error : public std::runtime_error {
public:
    /// An error with `status` (not AGGBOX_OK) and `message`.
    Error(aggbox_status status, const std::string &message)
        : std::runtime_error(message), status_(status) {}

    /// Why the call failed.
    [[nodiscard]] aggbox_status status() const noexcept { return status_; }

    /// A static description of status() ("invalid argument", "timed out",
    /// ...), as aggbox_status_string() gives it.
    [[nodiscard]] const char *status_string() const noexcept { return aggbox_status_string(status_); }

private:
    aggbox_status status_;
};

/// Throws the Error of a failed call, with this thread's last error, unless
/// `status` is AGGBOX_OK.
inline void check(aggbox_status status) {
    if (status != AGGBOX_OK) {
        std::string message = last_error();
        if (message.empty()) {
            message = aggbox_status_string(status);
        }
        throw Error(status, message);
    }
}

/// An aggbox_config with `size` and every default set by
/// aggbox_config_init(): rank 0, world_size 1, master_addr "127.0.0.1",
/// master_port 29500, iface "" (auto), port 0 (auto), datapath
/// AGGBOX_DATAPATH_AUTO, timeout_ms 30000. Change the fields you need and
/// pass it to Communicator.
[[nodiscard]] inline aggbox_config default_config() noexcept {
    aggbox_config config{};
    aggbox_config_init(&config);
    return config;
}

/// A communicator: owns an aggbox_comm, this process's membership in a group
/// of ranks that run collectives together, and destroys it (leaving the
/// group) when it goes out of scope. Move-only. A moved-from Communicator
/// holds no aggbox_comm: its getters give what C gives for NULL (-1,
/// AGGBOX_DATAPATH_AUTO, "") and its calls throw Error with
/// AGGBOX_ERR_INVALID_ARGUMENT.
class Communicator {
public:
    /// Joins a new communicator described by `config` (start from
    /// default_config(), which sets `config.size`): rendezvous with every
    /// rank at master_addr:master_port, then sets up the datapath. Blocks
    /// until all world_size ranks have joined. Throws Error when it fails
    /// (e.g. AGGBOX_ERR_INVALID_ARGUMENT for a bad config, AGGBOX_ERR_TIMEOUT
    /// when a rank did not join within timeout_ms).
    explicit Communicator(const aggbox_config &config) {
        check(aggbox_comm_init(&config, &comm_));
    }

    /// Like Communicator(config) with the configuration taken from the
    /// environment: RANK, WORLD_SIZE, MASTER_ADDR (required), MASTER_PORT,
    /// AGGBOX_IFACE, AGGBOX_PORT, AGGBOX_DATAPATH (auto, kernel or user) and
    /// AGGBOX_TIMEOUT_MS. Throws Error when it fails.
    [[nodiscard]] static Communicator from_env() {
        aggbox_comm *comm = nullptr;
        check(aggbox_comm_init_from_env(&comm));
        return Communicator(comm);
    }

    /// Takes ownership of `comm`, a communicator from aggbox_comm_init*() (or
    /// nullptr), which this object will destroy.
    static Communicator adopt(aggbox_comm *comm) noexcept { return Communicator(comm); }

    Communicator(const Communicator &) = delete;
    Communicator &operator=(const Communicator &) = delete;

    /// Takes the communicator of `other`, which is left empty.
    Communicator(Communicator &&other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}

    /// Destroys this object's communicator and takes the one of `other`,
    /// which is left empty.
    Communicator &operator=(Communicator &&other) noexcept {
        if (this != &other) {
            aggbox_comm_destroy(comm_);
            comm_ = std::exchange(other.comm_, nullptr);
        }
        return *this;
    }

    /// Leaves the group and frees the communicator (aggbox_comm_destroy).
    ~Communicator() { aggbox_comm_destroy(comm_); }

    /// This process's rank in the group, 0 .. size() - 1 (-1 when empty).
    [[nodiscard]] int rank() const noexcept { return aggbox_comm_rank(comm_); }

    /// Number of ranks in the group (-1 when empty).
    [[nodiscard]] int size() const noexcept { return aggbox_comm_size(comm_); }

    /// The datapath really in use: AGGBOX_DATAPATH_KERNEL or
    /// AGGBOX_DATAPATH_USER (AGGBOX_DATAPATH_AUTO when empty).
    [[nodiscard]] aggbox_datapath datapath() const noexcept { return aggbox_comm_datapath(comm_); }

    /// Why AGGBOX_DATAPATH_AUTO fell back to the user datapath; empty when it
    /// did not (or when this object is empty).
    [[nodiscard]] std::string datapath_reason() const {
        std::string reason(aggbox_comm_datapath_reason(comm_, nullptr, 0) + 1, '\0');
        std::size_t len = aggbox_comm_datapath_reason(comm_, &reason[0], reason.size());
        reason.resize(len < reason.size() ? len : reason.size() - 1);
        return reason;
    }

    /// Blocks until every rank of the group has called barrier(). Throws
    /// Error (AGGBOX_ERR_PEER_FAILED naming a rank that did not arrive within
    /// the timeout, ...).
    void barrier() { check(aggbox_barrier(comm_)); }

    /// A snapshot of the communicator's counters (aggbox_comm_stats). Throws
    /// Error when it fails.
    [[nodiscard]] aggbox_stats stats() const {
        aggbox_stats stats{};
        stats.size = sizeof stats;
        check(aggbox_comm_stats(comm_, &stats));
        return stats;
    }

    /// The aggbox_comm, still owned by this object, to call the C API with
    /// (nullptr when empty).
    [[nodiscard]] aggbox_comm *get() const noexcept { return comm_; }

    /// Gives up ownership: returns the aggbox_comm, which the caller must now
    /// destroy with aggbox_comm_destroy(), and leaves this object empty.
    [[nodiscard]] aggbox_comm *release() noexcept { return std::exchange(comm_, nullptr); }

    /// Whether this object holds a communicator (it does unless moved from
    /// or released).
    explicit operator bool() const noexcept { return comm_ != nullptr; }

private:
    explicit Communicator(aggbox_comm *comm) noexcept : comm_(comm) {}

    aggbox_comm *comm_ = nullptr;
};

}  // namespace aggbox

#endif  /* AGGBOX_HPP */
