/* C helpers of the Go binding. A goroutine may move to another OS thread
 * between two cgo calls, and aggbox_last_error is per thread, so every
 * call that can fail goes through one of these: the call and the reading
 * of its message happen in one cgo call, on one thread. The message is
 * malloc'd (NULL on success); the Go side frees it. */
#ifndef AGGBOX_GO_H
#define AGGBOX_GO_H

#include <stdlib.h>
#include <aggbox.h>

typedef struct agg_res {
    int status;
    char *msg;
} agg_res;

static inline agg_res agg_res_of(aggbox_status status) {
    agg_res r = {(int)status, NULL};
    if (status != AGGBOX_OK) {
        size_t n = aggbox_last_error(NULL, 0);
        r.msg = malloc(n + 1);
        if (r.msg != NULL) {
            aggbox_last_error(r.msg, n + 1);
        }
    }
    return r;
}

static inline agg_res agg_comm_init(const aggbox_config *config, aggbox_comm **out) {
    return agg_res_of(aggbox_comm_init(config, out));
}

static inline agg_res agg_comm_init_from_env(aggbox_comm **out) {
    return agg_res_of(aggbox_comm_init_from_env(out));
}

static inline agg_res agg_barrier(aggbox_comm *comm) {
    return agg_res_of(aggbox_barrier(comm));
}

static inline agg_res agg_broadcast(aggbox_comm *comm, void *buf, size_t count, int dtype, int root) {
    return agg_res_of(aggbox_broadcast(comm, buf, count, (aggbox_dtype)dtype, root));
}

static inline agg_res agg_ibroadcast(aggbox_comm *comm, void *buf, size_t count, int dtype, int root,
                                     aggbox_request **out) {
    return agg_res_of(aggbox_ibroadcast(comm, buf, count, (aggbox_dtype)dtype, root, out));
}

static inline agg_res agg_allreduce(aggbox_comm *comm, const void *send, void *recv, size_t count, int dtype,
                                    int op) {
    return agg_res_of(aggbox_allreduce(comm, send, recv, count, (aggbox_dtype)dtype, (aggbox_op)op));
}

static inline agg_res agg_iallreduce(aggbox_comm *comm, const void *send, void *recv, size_t count, int dtype,
                                     int op, aggbox_request **out) {
    return agg_res_of(aggbox_iallreduce(comm, send, recv, count, (aggbox_dtype)dtype, (aggbox_op)op, out));
}

static inline agg_res agg_reduce(aggbox_comm *comm, const void *send, void *recv, size_t count, int dtype, int op,
                                 int root) {
    return agg_res_of(aggbox_reduce(comm, send, recv, count, (aggbox_dtype)dtype, (aggbox_op)op, root));
}

static inline agg_res agg_reduce_scatter(aggbox_comm *comm, const void *send, void *recv, size_t recvcount,
                                         int dtype, int op) {
    return agg_res_of(aggbox_reduce_scatter(comm, send, recv, recvcount, (aggbox_dtype)dtype, (aggbox_op)op));
}

static inline agg_res agg_allgather(aggbox_comm *comm, const void *send, void *recv, size_t sendcount,
                                    int dtype) {
    return agg_res_of(aggbox_allgather(comm, send, recv, sendcount, (aggbox_dtype)dtype));
}

static inline agg_res agg_wait(aggbox_request *request) {
    return agg_res_of(aggbox_wait(request));
}

static inline agg_res agg_test(aggbox_request *request, int *done) {
    return agg_res_of(aggbox_test(request, done));
}

static inline agg_res agg_comm_stats(const aggbox_comm *comm, aggbox_stats *stats) {
    stats->size = sizeof *stats;
    return agg_res_of(aggbox_comm_stats(comm, stats));
}

/* The reason auto fell back to the user datapath, malloc'd. */
static inline char *agg_datapath_reason(const aggbox_comm *comm) {
    size_t n = aggbox_comm_datapath_reason(comm, NULL, 0);
    char *buf = malloc(n + 1);
    if (buf != NULL) {
        aggbox_comm_datapath_reason(comm, buf, n + 1);
    }
    return buf;
}

static inline agg_res agg_kv_begin(aggbox_comm *comm, const aggbox_kv_config *config, aggbox_kv **out) {
    return agg_res_of(aggbox_kv_begin(comm, config, out));
}

static inline agg_res agg_kv_emit(aggbox_kv *kv, const uint8_t *keys, const uint32_t *key_lens,
                                  const void *values, size_t n) {
    return agg_res_of(aggbox_kv_emit(kv, keys, key_lens, values, n));
}

static inline agg_res agg_kv_finish(aggbox_kv *kv, aggbox_kv_result **out) {
    return agg_res_of(aggbox_kv_finish(kv, out));
}

static inline agg_res agg_kv_result_get(const aggbox_kv_result *result, size_t i, const uint8_t **key,
                                        uint32_t *key_len, uint64_t *value) {
    return agg_res_of(aggbox_kv_result_get(result, i, key, key_len, value));
}

static inline agg_res agg_kv_result_stats(const aggbox_kv_result *result, aggbox_kv_stats *stats) {
    stats->size = sizeof *stats;
    return agg_res_of(aggbox_kv_result_stats(result, stats));
}

static inline agg_res agg_agree(aggbox_comm *comm, const aggbox_agree_config *config, double *value) {
    return agg_res_of(aggbox_agree(comm, config, value));
}

#endif /* AGGBOX_GO_H */
