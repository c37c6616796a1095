/*
 * abi_check.c: the error paths of the C API, without any network: NULL
 * arguments, bad configs, size versioning, status strings, versions and the
 * last error. Built and run by ffi/tests/c_abi.rs; exits 0 when every check
 * passes and ends with a line "N passed, N failed".
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "aggbox.h"

_Static_assert(sizeof(aggbox_status) == sizeof(int), "aggbox_status is int-sized");
_Static_assert(sizeof(aggbox_datapath) == sizeof(int), "aggbox_datapath is int-sized");
_Static_assert(offsetof(aggbox_config, size) == 0, "size comes first");
_Static_assert(offsetof(aggbox_stats, size) == 0, "size comes first");
_Static_assert(AGGBOX_PROG_COUNT == 3 && AGGBOX_STAT_COUNT == 10, "counter dimensions");

static int passed, failed;

#define CHECK(cond)                                                      \
    do {                                                                 \
        if (cond) {                                                      \
            passed++;                                                    \
        } else {                                                         \
            failed++;                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                \
    } while (0)

static char last[1024];

/* The last error, in `last`. */
static const char *last_error(void) {
    aggbox_last_error(last, sizeof last);
    return last;
}

/* Checks that the last error is about `func` and mentions `text`. */
static int error_says(const char *func, const char *text) {
    const char *message = last_error();
    int ok = strncmp(message, func, strlen(func)) == 0 && strstr(message, text) != NULL;
    if (!ok) {
        fprintf(stderr, "  last error \"%s\" does not say %s: ...%s...\n", message, func, text);
    }
    return ok;
}

static void versions(void) {
    CHECK(aggbox_abi_version() == AGGBOX_ABI_VERSION);
    CHECK(aggbox_version() != NULL && aggbox_version()[0] != '\0');
    for (int s = AGGBOX_OK; s <= AGGBOX_ERR_INTERNAL; s++) {
        const char *text = aggbox_status_string((aggbox_status)s);
        CHECK(text != NULL && text[0] != '\0');
    }
    CHECK(strcmp(aggbox_status_string(AGGBOX_OK), "success") == 0);
    CHECK(strcmp(aggbox_status_string((aggbox_status)99), "unknown status") == 0);
    CHECK(strcmp(aggbox_status_string((aggbox_status)-1), "unknown status") == 0);
}

static void null_arguments(void) {
    CHECK(aggbox_comm_size(NULL) == -1);
    CHECK(error_says("aggbox_comm_size", "comm is NULL"));
    CHECK(aggbox_comm_rank(NULL) == -1);
    CHECK(error_says("aggbox_comm_rank", "comm is NULL"));
    CHECK(aggbox_comm_datapath(NULL) == AGGBOX_DATAPATH_AUTO);
    CHECK(error_says("aggbox_comm_datapath", "comm is NULL"));
    CHECK(aggbox_barrier(NULL) == AGGBOX_ERR_INVALID_ARGUMENT);
    CHECK(error_says("aggbox_barrier", "comm is NULL"));

    aggbox_stats stats = {.size = sizeof stats};
    CHECK(aggbox_comm_stats(NULL, &stats) == AGGBOX_ERR_INVALID_ARGUMENT);
    CHECK(error_says("aggbox_comm_stats", "comm is NULL"));

    aggbox_comm_destroy(NULL); /* a no-op */

    aggbox_config config;
    aggbox_config_init(&config);
    CHECK(aggbox_comm_init(&config, NULL) == AGGBOX_ERR_INVALID_ARGUMENT);
    CHECK(error_says("aggbox_comm_init", "out is NULL"));
    aggbox_comm *comm = (aggbox_comm *)&config; /* must be overwritten with NULL */
    CHECK(aggbox_comm_init(NULL, &comm) == AGGBOX_ERR_INVALID_ARGUMENT);
    CHECK(comm == NULL);
    CHECK(error_says("aggbox_comm_init", "config is NULL"));
    CHECK(aggbox_comm_init_from_env(NULL) == AGGBOX_ERR_INVALID_ARGUMENT);
    CHECK(error_says("aggbox_comm_init_from_env", "out is NULL"));

    aggbox_config_init(NULL);
    CHECK(error_says("aggbox_config_init", "config is NULL"));
}

static void config_defaults(void) {
    aggbox_config config;
    memset(&config, 0xab, sizeof config);
    aggbox_config_init(&config);
    CHECK(config.size == sizeof config);
    CHECK(config.rank == 0);
    CHECK(config.world_size == 1);
    CHECK(strcmp(config.master_addr, "127.0.0.1") == 0);
    CHECK(config.master_port == 29500);
    CHECK(config.iface[0] == '\0');
    CHECK(config.port == 0);
    CHECK(config.datapath == AGGBOX_DATAPATH_AUTO);
    CHECK(config.timeout_ms == 30000);
    CHECK(config.store == AGGBOX_STORE_RANK0);
}

/* aggbox_comm_init with `config`, expected to fail with INVALID_ARGUMENT
 * saying `text`, leaving the output NULL. */
static int init_refused(const aggbox_config *config, const char *text) {
    aggbox_comm *comm = NULL;
    aggbox_status status = aggbox_comm_init(config, &comm);
    if (status != AGGBOX_ERR_INVALID_ARGUMENT) {
        fprintf(stderr, "  aggbox_comm_init gave %s: %s\n", aggbox_status_string(status), last_error());
        aggbox_comm_destroy(comm);
        return 0;
    }
    return comm == NULL && error_says("aggbox_comm_init", text);
}

static void bad_configs(void) {
    aggbox_config config;

    aggbox_config_init(&config);
    config.size = sizeof config + 8;
    CHECK(init_refused(&config, "newer aggbox.h"));

    aggbox_config_init(&config);
    config.size = 0;
    CHECK(init_refused(&config, "config->size is 0, smaller than any aggbox_config"));

    aggbox_config_init(&config);
    config.rank = 2;
    config.world_size = 2;
    CHECK(init_refused(&config, "rank 2 is not below the world size 2"));

    aggbox_config_init(&config);
    config.world_size = -1;
    CHECK(init_refused(&config, "world_size"));

    aggbox_config_init(&config);
    snprintf(config.master_addr, sizeof config.master_addr, "%s", "master.example");
    CHECK(init_refused(&config, "master_addr \"master.example\" is not an IPv4 address"));

    aggbox_config_init(&config);
    memset(config.iface, 'x', sizeof config.iface); /* no NUL */
    CHECK(init_refused(&config, "iface is not NUL-terminated"));

    aggbox_config_init(&config);
    config.datapath = (aggbox_datapath)42;
    CHECK(init_refused(&config, "datapath is 42"));

    aggbox_config_init(&config);
    config.timeout_ms = 0;
    CHECK(init_refused(&config, "timeout"));
}

/* A program built against an older, smaller aggbox_config: the fields past
 * its size are not read (here a bad datapath that would be refused), they
 * get their defaults. */
static void older_smaller_config(void) {
    aggbox_config config;
    aggbox_config_init(&config);
    config.size = offsetof(aggbox_config, datapath);
    config.datapath = (aggbox_datapath)42;
    config.rank = 5;
    config.world_size = 2;
    /* Refused for the rank, so the size was accepted and datapath not read. */
    CHECK(init_refused(&config, "rank 5 is not below the world size 2"));
}

static void last_error_buffer(void) {
    aggbox_barrier(NULL);
    const char *expected = "aggbox_barrier: invalid argument: comm is NULL";
    size_t len = strlen(expected);
    CHECK(aggbox_last_error(NULL, 0) == len);
    CHECK(aggbox_last_error(NULL, 10) == len);
    char small[8];
    memset(small, 'z', sizeof small);
    CHECK(aggbox_last_error(small, 0) == len && small[0] == 'z');
    CHECK(aggbox_last_error(small, sizeof small) == len);
    CHECK(strcmp(small, "aggbox_") == 0);
    char big[128];
    CHECK(aggbox_last_error(big, sizeof big) == len);
    CHECK(strcmp(big, expected) == 0);

    /* A successful call leaves the last error alone. */
    aggbox_config config;
    aggbox_config_init(&config);
    CHECK(strcmp(last_error(), expected) == 0);
}

static void stats_struct(void) {
    /* kernel[prog][stat] indexing as the enums name it. */
    aggbox_stats stats = {.size = sizeof stats};
    stats.kernel[AGGBOX_PROG_TC_EGRESS][AGGBOX_STAT_DROP_NOT_MEMBER] = 1;
    CHECK(stats.kernel[AGGBOX_PROG_COUNT - 1][AGGBOX_STAT_COUNT - 1] == 1);
    CHECK(AGGBOX_PROG_XDP_INGRESS == 0 && AGGBOX_STAT_SEEN == 0 && AGGBOX_STAT_ACCEPTED == 2);
}

int main(void) {
    versions();
    null_arguments();
    config_defaults();
    bad_configs();
    older_smaller_config();
    last_error_buffer();
    stats_struct();
    printf("abi_check: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
