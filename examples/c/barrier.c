/*
 * barrier.c: join a group from the environment and time N barriers.
 *
 *   RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 ./barrier 1000   # on each host
 *
 * Environment (as torch and Horovod use it): RANK, WORLD_SIZE, MASTER_ADDR,
 * and optionally MASTER_PORT, AGGBOX_IFACE, AGGBOX_PORT, AGGBOX_DATAPATH
 * (auto, kernel or user) and AGGBOX_TIMEOUT_MS.
 *
 * Prints one line on stdout, for scripts (wrapped here):
 *   rank=R size=S datapath=kernel|user barriers=N total_us=T per_barrier_us=X
 *     retransmits=N xdp_accepted=N tc_accepted=N
 * The counters are read after the timed barriers: the datagrams this rank
 * sent again, and the AggBox packets the XDP and the TC ingress programs
 * accepted on the interface (both 0 on the user datapath; XDP's 0 on the TC
 * hooks, which virtual devices get). When AGGBOX_DATAPATH=auto fell back
 * to the user datapath, it says why on stderr. On any error it prints the
 * status and the library's message on stderr and exits with 1. Build it with
 * the Makefile beside it.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "aggbox.h"

/* Prints the status of a failed call and the library's message, which
 * names the function that failed and says why. */
static void report(aggbox_status status) {
    char message[512];
    size_t len = aggbox_last_error(message, sizeof message);
    fprintf(stderr, "barrier: error (%s): %s%s\n", aggbox_status_string(status), message,
            len >= sizeof message ? "..." : "");
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    long n = 1000;
    if (argc > 2) {
        fprintf(stderr, "usage: %s [number of barriers, default 1000]\n", argv[0]);
        return 2;
    }
    if (argc == 2) {
        char *end;
        errno = 0;
        n = strtol(argv[1], &end, 10);
        if (errno != 0 || end == argv[1] || *end != '\0' || n < 1) {
            fprintf(stderr, "barrier: %s is not a number of barriers (1 or more)\n", argv[1]);
            return 2;
        }
    }

    aggbox_comm *comm = NULL;
    aggbox_status status = aggbox_comm_init_from_env(&comm);
    if (status != AGGBOX_OK) {
        report(status);
        return 1;
    }
    int rank = aggbox_comm_rank(comm);
    int size = aggbox_comm_size(comm);
    const char *datapath = aggbox_comm_datapath(comm) == AGGBOX_DATAPATH_KERNEL ? "kernel" : "user";
    fprintf(stderr, "barrier: libaggbox %s, rank %d of %d, %s datapath\n", aggbox_version(), rank, size,
            datapath);
    char reason[512];
    size_t reason_len = aggbox_comm_datapath_reason(comm, reason, sizeof reason);
    if (reason_len > 0) {
        fprintf(stderr, "aggbox: datapath auto fell back: %s%s\n", reason,
                reason_len >= sizeof reason ? "..." : "");
    }

    /* One barrier first so that every rank starts timing together. */
    status = aggbox_barrier(comm);
    if (status != AGGBOX_OK) {
        report(status);
        aggbox_comm_destroy(comm);
        return 1;
    }
    double start = now_us();
    for (long i = 0; i < n; i++) {
        status = aggbox_barrier(comm);
        if (status != AGGBOX_OK) {
            report(status);
            aggbox_comm_destroy(comm);
            return 1;
        }
    }
    double total_us = now_us() - start;

    aggbox_stats stats = {.size = sizeof stats};
    status = aggbox_comm_stats(comm, &stats);
    if (status != AGGBOX_OK) {
        report(status);
        aggbox_comm_destroy(comm);
        return 1;
    }

    printf("rank=%d size=%d datapath=%s barriers=%ld total_us=%.0f per_barrier_us=%.2f"
           " retransmits=%" PRIu64 " xdp_accepted=%" PRIu64 " tc_accepted=%" PRIu64 "\n",
           rank, size, datapath, n, total_us, total_us / (double)n, stats.retransmits,
           stats.kernel[AGGBOX_PROG_XDP_INGRESS][AGGBOX_STAT_ACCEPTED],
           stats.kernel[AGGBOX_PROG_TC_INGRESS][AGGBOX_STAT_ACCEPTED]);
    aggbox_comm_destroy(comm);
    return 0;
}
