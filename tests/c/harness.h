/* Shared helpers of the C tests of libpccl: thread-ranks, element conversion, checks.
 * Header-only (static functions) so each test program is a single translation unit. */
#ifndef PCCL_TEST_HARNESS_H
#define PCCL_TEST_HARNESS_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* setenv, sched_yield */
#endif

#include "pccl.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- one rank's context ----------------------------------------------------------------- */

struct rank_ctx;
typedef void (*rank_fn)(struct rank_ctx *r);

struct rank_ctx {
    int rank;
    int nranks;
    pcclThreadWorld_t world;
    rank_fn fn;
    void *user;
    int checks;
    int failures;
};

/* Records a failed check with a printf-style explanation (the first few are printed). */
static inline void fail(struct rank_ctx *r, const char *fmt, ...) {
    r->failures++;
    if (r->failures <= 12) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "FAIL rank %d/%d: ", r->rank, r->nranks);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
}

/* Checks that a call returned pcclSuccess; returns 1 if it did. */
#define CALL(r, comm, expr)                                                                    \
    ((r)->checks++, check_ok((r), (comm), (expr), #expr, __LINE__))

static inline int check_ok(struct rank_ctx *r, pcclComm_t comm, pcclResult_t rc, const char *what, int line) {
    if (rc == pcclSuccess) return 1;
    fail(r, "line %d: %s returned %d (%s): %s", line, what, rc, pcclGetErrorString(rc),
         pcclGetLastError(comm));
    return 0;
}

static inline void *rank_thread(void *arg) {
    struct rank_ctx *r = (struct rank_ctx *)arg;
    r->fn(r);
    return NULL;
}

/* Runs fn on nranks threads sharing a fresh thread world; returns the number of failures and
 * adds the number of checks to *checks. */
static inline int run_world(int nranks, rank_fn fn, void *user, int *checks) {
    pcclThreadWorld_t world = NULL;
    pcclResult_t rc = pcclThreadWorldCreate(nranks, &world);
    if (rc != pcclSuccess) {
        fprintf(stderr, "FAIL pcclThreadWorldCreate(%d): %s\n", nranks, pcclGetLastError(NULL));
        return 1;
    }
    struct rank_ctx *ctx = (struct rank_ctx *)calloc((size_t)nranks, sizeof *ctx);
    pthread_t *threads = (pthread_t *)calloc((size_t)nranks, sizeof *threads);
    int failures = 0;
    for (int i = 0; i < nranks; i++) {
        ctx[i].rank = i;
        ctx[i].nranks = nranks;
        ctx[i].world = world;
        ctx[i].fn = fn;
        ctx[i].user = user;
        if (pthread_create(&threads[i], NULL, rank_thread, &ctx[i]) != 0) {
            fprintf(stderr, "FAIL cannot start thread %d\n", i);
            exit(2);
        }
    }
    for (int i = 0; i < nranks; i++) {
        pthread_join(threads[i], NULL);
        failures += ctx[i].failures;
        *checks += ctx[i].checks;
    }
    if (pcclThreadWorldDestroy(world) != pcclSuccess) {
        fprintf(stderr, "FAIL pcclThreadWorldDestroy: %s\n", pcclGetLastError(NULL));
        failures++;
    }
    free(ctx);
    free(threads);
    return failures;
}

/* Builds this rank's communicator from its world (NULL after a recorded failure). */
static inline pcclComm_t init_comm(struct rank_ctx *r) {
    pcclComm_t comm = NULL;
    if (!CALL(r, NULL, pcclCommInitThreads(&comm, r->world, r->rank))) return NULL;
    return comm;
}

/* ---- datatypes ---------------------------------------------------------------------------- */


static inline const char *dtype_name(pcclDataType_t dt) {
    static const char *names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                  "uint64",  "float16", "float32", "float64", "bfloat16"};
    return dt >= 0 && dt < pcclNumTypes ? names[dt] : "?";
}

static inline const char *op_name(pcclRedOp_t op) {
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return op >= 0 && op < pcclNumOps ? names[op] : "?";
}

static inline size_t dtype_size(pcclDataType_t dt) {
    switch (dt) {
    case pcclInt8: case pcclUint8: return 1;
    case pcclFloat16: case pcclBfloat16: return 2;
    case pcclInt32: case pcclUint32: case pcclFloat32: return 4;
    default: return 8;
    }
}

static inline int dtype_is_float(pcclDataType_t dt) {
    return dt == pcclFloat16 || dt == pcclBfloat16 || dt == pcclFloat32 || dt == pcclFloat64;
}

static inline int dtype_is_signed(pcclDataType_t dt) {
    return dt == pcclInt8 || dt == pcclInt32 || dt == pcclInt64 || dtype_is_float(dt);
}

/* IEEE binary16 from a float, rounding to nearest even (normal range; the tests use small
 * integers and never reach subnormals). */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    int32_t e = (int32_t)((x >> 23) & 0xffu);
    uint32_t mant = x & 0x7fffffu;
    if (e == 0) return sign; /* zero (or a float subnormal): 0 */
    if (e == 255) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    int32_t he = e - 127 + 15;
    if (he >= 31) return (uint16_t)(sign | 0x7c00u);
    if (he <= 0) return sign;
    uint32_t h = ((uint32_t)he << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (e == 0) {
        float v = (float)mant / 16777216.0f; /* mant * 2^-24 */
        return sign ? -v : v;
    }
    if (e == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((e - 15 + 127) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t rest = x & 0xffffu, h = x >> 16;
    if (rest > 0x8000u || (rest == 0x8000u && (h & 1u))) h++;
    return (uint16_t)h;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Element i of buffer b of datatype dt, as a double (exact for the tests' values). */
static inline double get_elem(const void *b, pcclDataType_t dt, size_t i) {
    switch (dt) {
    case pcclInt8: return ((const int8_t *)b)[i];
    case pcclUint8: return ((const uint8_t *)b)[i];
    case pcclInt32: return ((const int32_t *)b)[i];
    case pcclUint32: return ((const uint32_t *)b)[i];
    case pcclInt64: return (double)((const int64_t *)b)[i];
    case pcclUint64: return (double)((const uint64_t *)b)[i];
    case pcclFloat16: return f16_to_f32(((const uint16_t *)b)[i]);
    case pcclBfloat16: return bf16_to_f32(((const uint16_t *)b)[i]);
    case pcclFloat32: return ((const float *)b)[i];
    default: return ((const double *)b)[i];
    }
}

/* Stores v as element i of buffer b of datatype dt. */
static inline void set_elem(void *b, pcclDataType_t dt, size_t i, double v) {
    switch (dt) {
    case pcclInt8: ((int8_t *)b)[i] = (int8_t)v; break;
    case pcclUint8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    case pcclInt32: ((int32_t *)b)[i] = (int32_t)v; break;
    case pcclUint32: ((uint32_t *)b)[i] = (uint32_t)v; break;
    case pcclInt64: ((int64_t *)b)[i] = (int64_t)v; break;
    case pcclUint64: ((uint64_t *)b)[i] = (uint64_t)v; break;
    case pcclFloat16: ((uint16_t *)b)[i] = f32_to_f16((float)v); break;
    case pcclBfloat16: ((uint16_t *)b)[i] = f32_to_bf16((float)v); break;
    case pcclFloat32: ((float *)b)[i] = (float)v; break;
    default: ((double *)b)[i] = v; break;
    }
}

/* A buffer of n elements of dt (NULL for n == 0), filled with the byte 0x5a. */
static inline void *alloc_elems(pcclDataType_t dt, size_t n) {
    if (n == 0) return NULL;
    void *b = malloc(n * dtype_size(dt));
    if (!b) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(b, 0x5a, n * dtype_size(dt));
    return b;
}

#endif
