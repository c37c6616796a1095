// aggbox_hpp_check.cpp: checks of the C++ wrapper bindings/cpp/aggbox.hpp, on
// one-rank communicators at 127.0.0.1 (no peer, no privilege). Built and run
// by ffi/tests/cpp.rs; exits 0 when every check passes and ends with a line
// "N passed, N failed".
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "aggbox.hpp"

static_assert(std::is_base_of<std::runtime_error, aggbox::Error>::value, "Error is a runtime_error");
static_assert(!std::is_copy_constructible<aggbox::Communicator>::value, "move-only");
static_assert(!std::is_copy_assignable<aggbox::Communicator>::value, "move-only");
static_assert(std::is_nothrow_move_constructible<aggbox::Communicator>::value, "noexcept move");
static_assert(std::is_nothrow_move_assignable<aggbox::Communicator>::value, "noexcept move");
static_assert(!std::is_default_constructible<aggbox::Communicator>::value, "joins a group or throws");

static int passed, failed;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (cond) {                                                                        \
            passed++;                                                                      \
        } else {                                                                           \
            failed++;                                                                      \
            std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                                  \
    } while (0)

static bool contains(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

// Runs `body`, which must throw aggbox::Error with `status` and a message
// starting with `func` and containing `text`.
template <typename Body>
static bool throws(aggbox_status status, const char *func, const char *text, Body body) {
    try {
        body();
        std::fprintf(stderr, "  no aggbox::Error thrown\n");
        return false;
    } catch (const aggbox::Error &e) {
        std::string message = e.what();
        bool ok = e.status() == status && message.rfind(func, 0) == 0 && contains(message, text) &&
                  std::strcmp(e.status_string(), aggbox_status_string(status)) == 0;
        if (!ok) {
            std::fprintf(stderr, "  aggbox::Error (%s) \"%s\" is not %s from %s: ...%s...\n", e.status_string(),
                         message.c_str(), aggbox_status_string(status), func, text);
        }
        return ok;
    }
}

static aggbox_config one_rank(aggbox_datapath datapath) {
    aggbox_config config = aggbox::default_config();
    config.datapath = datapath;
    return config;
}

static void invalid_configs_throw() {
    aggbox_config config = aggbox::default_config();
    CHECK(config.size == sizeof config && config.world_size == 1 && config.timeout_ms == 30000);

    config.world_size = 0;
    CHECK(throws(AGGBOX_ERR_INVALID_ARGUMENT, "aggbox_comm_init: ", "world size 0 is not in 1..=",
                 [&] { aggbox::Communicator comm(config); }));
    try {
        aggbox::Communicator comm(config);
        CHECK(false);
    } catch (const aggbox::Error &e) {
        CHECK(e.status() == AGGBOX_ERR_INVALID_ARGUMENT);
        CHECK(std::strlen(e.what()) > 0);
        CHECK(aggbox::last_error() == e.what());
    }

    config = aggbox::default_config();
    config.rank = 2;
    config.world_size = 2;
    CHECK(throws(AGGBOX_ERR_INVALID_ARGUMENT, "aggbox_comm_init: ", "rank 2 is not below the world size 2",
                 [&] { aggbox::Communicator comm(config); }));

    config = aggbox::default_config();
    config.size = sizeof config + 8;
    CHECK(throws(AGGBOX_ERR_INVALID_ARGUMENT, "aggbox_comm_init: ", "newer aggbox.h",
                 [&] { aggbox::Communicator comm(config); }));
}

static void one_rank_communicator() {
    aggbox::Communicator comm(one_rank(AGGBOX_DATAPATH_USER));
    CHECK(static_cast<bool>(comm) && comm.get() != nullptr);
    CHECK(comm.rank() == 0);
    CHECK(comm.size() == 1);
    CHECK(comm.datapath() == AGGBOX_DATAPATH_USER);
    CHECK(comm.datapath_reason().empty());
    for (int i = 0; i < 3; i++) {
        comm.barrier();
    }
    aggbox_stats stats = comm.stats();
    CHECK(stats.size == sizeof stats);
    CHECK(stats.barriers == 3);
    CHECK(stats.datapath == AGGBOX_DATAPATH_USER);
    CHECK(stats.kernel[AGGBOX_PROG_XDP_INGRESS][AGGBOX_STAT_ACCEPTED] == 0);
}

// Auto on loopback cannot have the kernel datapath: it falls back and says why.
static void auto_fallback_reason() {
    aggbox::Communicator comm(one_rank(AGGBOX_DATAPATH_AUTO));
    CHECK(comm.datapath() == AGGBOX_DATAPATH_USER);
    std::string reason = comm.datapath_reason();
    CHECK(reason.rfind("auto chose the user datapath on ", 0) == 0);
    CHECK(contains(reason, "loopback"));
    CHECK(reason.size() == std::strlen(reason.c_str()));
}

static void moves() {
    aggbox::Communicator a(one_rank(AGGBOX_DATAPATH_USER));
    aggbox_comm *raw = a.get();
    aggbox::Communicator b(std::move(a));
    CHECK(b.get() == raw && !a && a.get() == nullptr);
    // A moved-from communicator gives what C gives for NULL.
    CHECK(a.rank() == -1 && a.size() == -1 && a.datapath() == AGGBOX_DATAPATH_AUTO);
    CHECK(a.datapath_reason().empty());
    CHECK(throws(AGGBOX_ERR_INVALID_ARGUMENT, "aggbox_barrier: ", "comm is NULL", [&] { a.barrier(); }));
    CHECK(throws(AGGBOX_ERR_INVALID_ARGUMENT, "aggbox_comm_stats: ", "comm is NULL", [&] { (void)a.stats(); }));
    b.barrier();

    // Assignment destroys the communicator it replaces.
    aggbox::Communicator c(one_rank(AGGBOX_DATAPATH_USER));
    c = std::move(b);
    CHECK(c.get() == raw && !b);
    aggbox::Communicator &same = c;
    c = std::move(same);  // self-move keeps it
    CHECK(c.get() == raw);
    c.barrier();

    aggbox_comm *released = c.release();
    CHECK(released == raw && !c);
    aggbox::Communicator adopted = aggbox::Communicator::adopt(released);
    CHECK(adopted.rank() == 0);
    adopted.barrier();
}

int main() {
    try {
        invalid_configs_throw();
        one_rank_communicator();
        auto_fallback_reason();
        moves();
    } catch (const aggbox::Error &e) {
        failed++;
        std::fprintf(stderr, "unexpected aggbox::Error (%s): %s\n", e.status_string(), e.what());
    }
    std::printf("aggbox_hpp_check: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
