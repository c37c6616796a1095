/*
 * aggbox.hpp: a header-only C++17 wrapper of the C API in aggbox.h.
 * SPDX-License-Identifier: Apache-2.0
 *
 *   #include "aggbox.hpp"
 *
 *   aggbox::Communicator comm = aggbox::Communicator::from_env();
 *   comm.barrier();                       // throws aggbox::Error on failure
 *   std::vector<float> grad(n);
 *   comm.allreduce(grad.data(), n, AGGBOX_OP_SUM);               // in place
 *   aggbox::Request r = comm.iallreduce(grad.data(), n, AGGBOX_OP_AVG);
 *   r.wait();                             // grad is the library's until then
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
 *
 * Buffers. The collectives take a pointer and a count of elements, as in C,
 * either untyped (with an aggbox_dtype) or typed: the element type then
 * gives the aggbox_dtype (aggbox::dtype_of). Asynchronous operations return
 * an aggbox::Request; their buffers belong to the library until it has
 * finished (wait() returned, test() returned true, or the Request was
 * destroyed, which waits for it).
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
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
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

namespace detail {

template <typename T>
constexpr bool always_false = false;

/// The aggbox_dtype of elements of type T; not defined for other types.
template <typename T>
constexpr aggbox_dtype dtype_of() noexcept {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, float> && sizeof(float) == 4) {
        return AGGBOX_DTYPE_F32;
    } else if constexpr (std::is_same_v<U, double> && sizeof(double) == 8) {
        return AGGBOX_DTYPE_F64;
    } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && sizeof(U) == 1 &&
                         std::is_unsigned_v<U>) {
        return AGGBOX_DTYPE_U8;
    } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && sizeof(U) == 4) {
        return std::is_signed_v<U> ? AGGBOX_DTYPE_I32 : AGGBOX_DTYPE_U32;
    } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> && sizeof(U) == 8) {
        return std::is_signed_v<U> ? AGGBOX_DTYPE_I64 : AGGBOX_DTYPE_U64;
    } else {
        static_assert(always_false<T>,
                      "aggbox: no aggbox_dtype for this element type (take float, double, 32- or 64-bit "
                      "integers, or uint8_t)");
        return AGGBOX_DTYPE_U8;
    }
}

}  // namespace detail

/// The aggbox_dtype of C++ elements of type T: float (AGGBOX_DTYPE_F32),
/// double (F64), 32- and 64-bit signed and unsigned integers (I32, U32, I64,
/// U64) and uint8_t (U8, for allgather; bytes are not reduced). Any other
/// type fails to compile.
template <typename T>
inline constexpr aggbox_dtype dtype_of = detail::dtype_of<T>();

/// An asynchronous operation in progress: owns an aggbox_request, made by
/// Communicator::iallreduce, and frees it (aggbox_request_free) when it goes
/// out of scope, first waiting for the operation if it has not finished, so
/// that its buffers may be reused once the Request is gone (its status is
/// then lost: call wait() to know it). Move-only. It may be waited for or
/// tested from any thread, and it stays valid after its Communicator is
/// destroyed. A moved-from Request holds nothing: wait() and test() throw
/// Error with AGGBOX_ERR_INVALID_ARGUMENT.
class Request {
public:
    /// Takes ownership of `request`, from aggbox_ibroadcast() or
    /// aggbox_iallreduce() (or nullptr), which this object will free.
    static Request adopt(aggbox_request *request) noexcept { return Request(request); }

    Request(const Request &) = delete;
    Request &operator=(const Request &) = delete;

    /// Takes the request of `other`, which is left empty.
    Request(Request &&other) noexcept : request_(std::exchange(other.request_, nullptr)) {}

    /// Frees this object's request (waiting for it) and takes the one of
    /// `other`, which is left empty.
    Request &operator=(Request &&other) noexcept {
        if (this != &other) {
            aggbox_request_free(request_);
            request_ = std::exchange(other.request_, nullptr);
        }
        return *this;
    }

    /// Waits for the operation if it has not finished, then frees it.
    ~Request() { aggbox_request_free(request_); }

    /// Blocks until the operation has finished (aggbox_wait). Throws Error
    /// with its status when it failed (e.g. AGGBOX_ERR_PEER_FAILED, the
    /// message naming the rank and the operation); waiting again throws the
    /// same.
    void wait() { check(aggbox_wait(request_)); }

    /// Whether the operation has finished, without waiting (aggbox_test).
    /// Throws Error when it finished with a failure.
    [[nodiscard]] bool test() {
        int done = 0;
        check(aggbox_test(request_, &done));
        return done != 0;
    }

    /// The aggbox_request, still owned by this object (nullptr when empty).
    [[nodiscard]] aggbox_request *get() const noexcept { return request_; }

    /// Gives up ownership: returns the aggbox_request, which the caller must
    /// now free with aggbox_request_free(), and leaves this object empty.
    [[nodiscard]] aggbox_request *release() noexcept { return std::exchange(request_, nullptr); }

    /// Whether this object holds a request.
    explicit operator bool() const noexcept { return request_ != nullptr; }

private:
    explicit Request(aggbox_request *request) noexcept : request_(request) {}

    aggbox_request *request_ = nullptr;
};

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

    /// Reduces `count` elements of `dtype` with `op` across every rank
    /// (aggbox_allreduce): every rank's `recvbuf` gets, at each index, `op`
    /// over the ranks' `sendbuf`. In place when `sendbuf == recvbuf`.
    /// Throws Error (AGGBOX_ERR_INVALID_ARGUMENT for a NULL buffer, AVG on
    /// integers or u8 elements, mismatched calls; AGGBOX_ERR_PEER_FAILED
    /// naming a rank that stopped answering; ...).
    void allreduce(const void *sendbuf, void *recvbuf, std::size_t count, aggbox_dtype dtype, aggbox_op op) {
        check(aggbox_allreduce(comm_, sendbuf, recvbuf, count, dtype, op));
    }

    /// allreduce() of `count` elements of T from `sendbuf` into `recvbuf`.
    template <typename T>
    void allreduce(const T *sendbuf, T *recvbuf, std::size_t count, aggbox_op op) {
        allreduce(sendbuf, recvbuf, count, dtype_of<T>, op);
    }

    /// allreduce() of `count` elements of T in place.
    template <typename T>
    void allreduce(T *buf, std::size_t count, aggbox_op op) {
        allreduce(buf, buf, count, dtype_of<T>, op);
    }

    /// Reduces `count` elements of `dtype` with `op` into `recvbuf` at rank
    /// `root` (aggbox_reduce); `recvbuf` is only used at the root (it may
    /// be nullptr elsewhere), in place there when `sendbuf == recvbuf`.
    /// Throws Error as allreduce() does, and for a `root` that is not a
    /// rank.
    void reduce(const void *sendbuf, void *recvbuf, std::size_t count, aggbox_dtype dtype, aggbox_op op, int root) {
        check(aggbox_reduce(comm_, sendbuf, recvbuf, count, dtype, op, root));
    }

    /// reduce() of `count` elements of T from `sendbuf` into `recvbuf` at
    /// `root`.
    template <typename T>
    void reduce(const T *sendbuf, T *recvbuf, std::size_t count, aggbox_op op, int root) {
        reduce(sendbuf, recvbuf, count, dtype_of<T>, op, root);
    }

    /// reduce() of `count` elements of T in place (at the root; elsewhere
    /// `buf` is only read).
    template <typename T>
    void reduce(T *buf, std::size_t count, aggbox_op op, int root) {
        reduce(buf, buf, count, dtype_of<T>, op, root);
    }

    /// Reduces `size() x recvcount` elements of `dtype` at `sendbuf` with
    /// `op` across every rank and leaves block `rank()` of the result
    /// (`recvcount` elements) in `recvbuf` (aggbox_reduce_scatter). The two
    /// buffers must not overlap. Throws Error as allreduce() does.
    void reduce_scatter(const void *sendbuf, void *recvbuf, std::size_t recvcount, aggbox_dtype dtype,
                        aggbox_op op) {
        check(aggbox_reduce_scatter(comm_, sendbuf, recvbuf, recvcount, dtype, op));
    }

    /// reduce_scatter() of elements of T.
    template <typename T>
    void reduce_scatter(const T *sendbuf, T *recvbuf, std::size_t recvcount, aggbox_op op) {
        reduce_scatter(sendbuf, recvbuf, recvcount, dtype_of<T>, op);
    }

    /// Gathers `sendcount` elements of `dtype` from every rank into every
    /// rank's `recvbuf` (`size() x sendcount` elements, rank r's at
    /// r x sendcount; aggbox_allgather). The two buffers must not overlap.
    /// Throws Error (AGGBOX_ERR_INVALID_ARGUMENT for a NULL buffer or
    /// mismatched calls, AGGBOX_ERR_PEER_FAILED, ...).
    void allgather(const void *sendbuf, void *recvbuf, std::size_t sendcount, aggbox_dtype dtype) {
        check(aggbox_allgather(comm_, sendbuf, recvbuf, sendcount, dtype));
    }

    /// allgather() of elements of T.
    template <typename T>
    void allgather(const T *sendbuf, T *recvbuf, std::size_t sendcount) {
        allgather(sendbuf, recvbuf, sendcount, dtype_of<T>);
    }

    /// Starts the allreduce of allreduce() on the communicator's progress
    /// thread and returns at once (aggbox_iallreduce); the arguments are
    /// checked first, and a bad one throws Error with nothing started. The
    /// buffers belong to the library until the returned Request has
    /// finished; blocking calls on this communicator meanwhile queue behind
    /// it. Keep the Request: destroying it waits for the operation.
    [[nodiscard]] Request iallreduce(const void *sendbuf, void *recvbuf, std::size_t count, aggbox_dtype dtype,
                                     aggbox_op op) {
        aggbox_request *request = nullptr;
        check(aggbox_iallreduce(comm_, sendbuf, recvbuf, count, dtype, op, &request));
        return Request::adopt(request);
    }

    /// iallreduce() of `count` elements of T from `sendbuf` into `recvbuf`.
    template <typename T>
    [[nodiscard]] Request iallreduce(const T *sendbuf, T *recvbuf, std::size_t count, aggbox_op op) {
        return iallreduce(sendbuf, recvbuf, count, dtype_of<T>, op);
    }

    /// iallreduce() of `count` elements of T in place.
    template <typename T>
    [[nodiscard]] Request iallreduce(T *buf, std::size_t count, aggbox_op op) {
        return iallreduce(buf, buf, count, dtype_of<T>, op);
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
