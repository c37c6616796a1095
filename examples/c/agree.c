/*
 * agree.c: approximate agreement that survives crashes and restarts.
 *
 *   AGGBOX_STORE=external MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 AGGBOX_PORT=47000 \
 *   RANK=0 WORLD_SIZE=5 ./agree INPUT STORE [F [EPSILON [LO HI [LINGER_MS]]]]   # on each host
 *
 * Every rank passes INPUT (a double) and gets back a value within the
 * inputs' range and within EPSILON (default 1e-6) of every other rank's,
 * while up to F (default 0) ranks crash forever. STORE is this rank's
 * persistent store file: kill this program at any moment and start it again
 * with the same environment and arguments, and it resumes from the store.
 * LO and HI (default 0 and 1e6) bound every rank's input; LINGER_MS is how
 * long a rank that decided keeps answering the others (default 1000). With
 * AGGBOX_STORE=external the rendezvous store at MASTER_ADDR:MASTER_PORT is
 * an `aggbox store` of its own, which lets a restarted rank rejoin; its
 * address must stay the same (set AGGBOX_PORT).
 *
 * Prints on stdout, for scripts: `joined rank=R` once its communicator is
 * up, then
 *   rank=R size=S datapath=kernel|user value=V total_us=T phases=N jumps=N
 *     restarts=N values_on_socket=N quorums_from_kernel=N answers=N fanouts=N
 * (V with 17 significant digits). On any error it prints the status and the
 * library's message on stderr and exits with 1.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "aggbox.h"

static void report(aggbox_status status) {
    char message[512];
    size_t len = aggbox_last_error(message, sizeof message);
    fprintf(stderr, "agree: error (%s): %s%s\n", aggbox_status_string(status), message,
            len >= sizeof message ? "..." : "");
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s INPUT STORE [F [EPSILON [LO HI [LINGER_MS]]]]\n", argv[0]);
        return 2;
    }
    aggbox_agree_config config;
    aggbox_agree_config_init(&config);
    double value = strtod(argv[1], NULL);
    config.store_path = argv[2];
    config.f = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 0;
    config.epsilon = argc > 4 ? strtod(argv[4], NULL) : 1e-6;
    config.lo = argc > 6 ? strtod(argv[5], NULL) : 0.0;
    config.hi = argc > 6 ? strtod(argv[6], NULL) : 1e6;
    if (argc > 7)
        config.linger_ms = (uint32_t)strtoul(argv[7], NULL, 10);

    aggbox_comm *comm;
    aggbox_status status = aggbox_comm_init_from_env(&comm);
    if (status != AGGBOX_OK) {
        report(status);
        return 1;
    }
    printf("joined rank=%d\n", aggbox_comm_rank(comm));
    fflush(stdout);
    double start = now_us();
    status = aggbox_agree(comm, &config, &value);
    double elapsed = now_us() - start;
    if (status != AGGBOX_OK) {
        report(status);
        aggbox_comm_destroy(comm);
        return 1;
    }
    aggbox_stats stats = {.size = sizeof stats};
    aggbox_comm_stats(comm, &stats);
    printf("rank=%d size=%d datapath=%s value=%.17g total_us=%.0f phases=%" PRIu64 " jumps=%" PRIu64
           " restarts=%" PRIu64 " values_on_socket=%" PRIu64 " quorums_from_kernel=%" PRIu64 " answers=%" PRIu64
           " fanouts=%" PRIu64 "\n",
           aggbox_comm_rank(comm), aggbox_comm_size(comm),
           aggbox_comm_datapath(comm) == AGGBOX_DATAPATH_KERNEL ? "kernel" : "user", value, elapsed,
           stats.agree_phases, stats.agree_jumps, stats.agree_restarts, stats.agree_values_received,
           stats.agree_quorums_from_kernel, stats.agree_answers_sent, stats.agree_fanouts);
    fflush(stdout);
    aggbox_comm_destroy(comm);
    return 0;
}
