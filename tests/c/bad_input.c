/* Bad input through the C API: every row must return its code and a message naming the
 * problem, never crash or hang, and leave the communicator usable.
 *
 * usage: bad_input [mpi]   ("mpi": the library was built with MPI, skip the no-MPI row)
 * Runs on 2 thread-ranks; every row fails the same way on both, before any communication. */
#include "harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int HAS_MPI = 0;

/* Checks one row: the code, and that both pcclGetLastError(NULL) and, for a live comm,
 * pcclGetLastError(comm) carry a message containing `want` and starting with `func`. */
static void check_row(struct rank_ctx *R, int line, const char *call, pcclResult_t rc,
                      pcclResult_t code, const char *want, pcclComm_t comm) {
    R->checks++;
    if (rc != code) {
        fail(R, "line %d: %s returned %d (%s), expected %d (%s); message: %s", line, call, rc,
             pcclGetErrorString(rc), code, pcclGetErrorString(code), pcclGetLastError(NULL));
        return;
    }
    if (code == pcclSuccess) return;
    const char *msg = pcclGetLastError(NULL);
    size_t flen = strcspn(call, "(");
    if (!msg || !strstr(msg, want) || strncmp(msg, call, flen) != 0 || msg[flen] != ':') {
        fail(R, "line %d: %s: thread message \"%s\" lacks \"%s\" or the function name", line,
             call, msg ? msg : "(null)", want);
        return;
    }
    if (comm) {
        msg = pcclGetLastError(comm);
        if (!msg || !strstr(msg, want))
            fail(R, "line %d: %s: comm message \"%s\" lacks \"%s\"", line, call, msg ? msg : "(null)", want);
    }
}

/* A row: expected code, a substring of the message, the call, and the comm it reports on. */
#define ROW(code, want, comm, call) check_row(R, __LINE__, #call, (call), (code), (want), (comm))

static void rank_main(struct rank_ctx *R) {
    int r = R->rank;
    pcclComm_t comm = init_comm(R);
    if (!comm) return;

    float f[8] = {0}, g[8] = {0};
    double d[8] = {0};
    _Alignas(8) char bytes[64] = {0};
    int32_t i32[8] = {0};
    int out = 0;
    pcclRequest_t req = NULL;
    pcclComm_t c2 = NULL;

    /* A dead communicator handle of this thread's own (a one-rank world). */
    pcclThreadWorld_t solo = NULL;
    pcclComm_t dead = NULL;
    CALL(R, NULL, pcclThreadWorldCreate(1, &solo));
    CALL(R, NULL, pcclCommInitThreads(&dead, solo, 0));
    CALL(R, NULL, pcclCommDestroy(dead));

    /* ---- handles ---- */
    ROW(pcclInvalidArgument, "comm is NULL", NULL, pcclAllReduce(f, g, 4, pcclFloat32, pcclSum, NULL, NULL));
    ROW(pcclInvalidArgument, "never created by PCCL", NULL,
        pcclAllReduce(f, g, 4, pcclFloat32, pcclSum, (pcclComm_t)(uintptr_t)0x1234, NULL));
    ROW(pcclInvalidArgument, "never created by PCCL", NULL, pcclBarrier((pcclComm_t)(void *)f));
    ROW(pcclInvalidUsage, "was destroyed", NULL, pcclAllReduce(f, g, 4, pcclFloat32, pcclSum, dead, NULL));
    ROW(pcclInvalidUsage, "was destroyed", NULL, pcclBarrier(dead));
    ROW(pcclInvalidUsage, "was destroyed", NULL, pcclCommCount(dead, &out));
    ROW(pcclInvalidUsage, "was destroyed", NULL, pcclCommDestroy(dead));
    ROW(pcclInvalidArgument, "is a thread world", NULL, pcclBarrier((pcclComm_t)solo));
    ROW(pcclInvalidArgument, "is a communicator", NULL, pcclWait((pcclRequest_t)comm));
    ROW(pcclInvalidArgument, "is a communicator", NULL, pcclThreadWorldDestroy((pcclThreadWorld_t)comm));
    ROW(pcclSuccess, "", NULL, pcclThreadWorldDestroy(solo));
    ROW(pcclInvalidUsage, "destroyed by pcclThreadWorldDestroy", NULL, pcclCommInitThreads(&c2, solo, 0));
    ROW(pcclSuccess, "", NULL, pcclCommDestroy(NULL));
    ROW(pcclSuccess, "", NULL, pcclThreadWorldDestroy(NULL));

    /* ---- datatypes and ops ---- */
    ROW(pcclInvalidArgument, "datatype -1 is not a pcclDataType_t", comm, pcclAllReduce(f, g, 4, -1, pcclSum, comm, NULL));
    ROW(pcclInvalidArgument, "datatype 10 is not a pcclDataType_t", comm, pcclAllGather(f, g, 2, 10, comm, NULL));
    ROW(pcclInvalidArgument, "datatype 99 is not", comm, pcclBroadcast(f, g, 4, 99, 0, comm, NULL));
    ROW(pcclInvalidArgument, "op 5 is not a pcclRedOp_t", comm, pcclAllReduce(f, g, 4, pcclFloat32, 5, comm, NULL));
    ROW(pcclInvalidArgument, "op -3 is not a pcclRedOp_t", comm, pcclReduceScatter(f, g, 2, pcclFloat32, -3, comm, NULL));
    ROW(pcclInvalidArgument, "op avg is not defined for dtype i32", comm,
        pcclAllReduce(i32, i32, 4, pcclInt32, pcclAvg, comm, NULL));
    ROW(pcclInvalidArgument, "op avg is not defined for dtype u8", comm,
        pcclReduceScatter(bytes, bytes + 16, 2, pcclUint8, pcclAvg, comm, NULL));

    /* ---- buffers ---- */
    ROW(pcclInvalidArgument, "NULL", comm, pcclAllReduce(NULL, g, 4, pcclFloat32, pcclSum, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclAllReduce(f, NULL, 4, pcclFloat32, pcclSum, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclAllGather(f, NULL, 1, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclReduceScatter(NULL, g, 1, pcclFloat32, pcclSum, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclBroadcast(f, NULL, 1, pcclFloat32, 0, comm, NULL));
    ROW(pcclInvalidArgument, "aligned to 4 bytes", comm,
        pcclAllReduce(bytes + 1, bytes + 32, 4, pcclFloat32, pcclSum, comm, NULL));
    ROW(pcclInvalidArgument, "aligned to 8 bytes", comm,
        pcclAllGather(bytes + 4, bytes + 16, 1, pcclFloat64, comm, NULL));
    ROW(pcclInvalidArgument, "overlap", comm, pcclAllReduce(f, f + 1, 4, pcclFloat32, pcclSum, comm, NULL));
    ROW(pcclInvalidArgument, "overlap", comm, pcclAllGather(f + 1, f, 2, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "overlap", comm, pcclReduceScatter(f, f + 1, 2, pcclFloat32, pcclSum, comm, NULL));

    /* ---- counts whose buffers overflow ---- */
    ROW(pcclInvalidArgument, "overflows", comm, pcclAllReduce(d, d, SIZE_MAX / 4, pcclFloat64, pcclSum, comm, NULL));
    ROW(pcclInvalidArgument, "overflows", comm, pcclAllReduce(bytes, bytes, SIZE_MAX, pcclInt8, pcclSum, comm, NULL));
    ROW(pcclInvalidArgument, "ranks overflows", comm, pcclAllGather(i32, i32, SIZE_MAX / 2 + 1, pcclInt32, comm, NULL));
    ROW(pcclInvalidArgument, "ranks overflows", comm,
        pcclReduceScatter(bytes, bytes, SIZE_MAX, pcclUint8, pcclMax, comm, NULL));
    ROW(pcclInvalidArgument, "overflows", comm, pcclBroadcast(d, d, SIZE_MAX / 2, pcclFloat64, 0, comm, NULL));
    ROW(pcclInvalidArgument, "overflows", comm,
        pcclIallReduce(d, d, SIZE_MAX / 8 + 1, pcclFloat64, pcclSum, comm, &req));

    /* ---- roots, streams, out-pointers ---- */
    ROW(pcclInvalidArgument, "root -1 is negative", comm, pcclBroadcast(f, g, 4, pcclFloat32, -1, comm, NULL));
    ROW(pcclInvalidArgument, "root 2 is not a rank", comm, pcclBroadcast(f, g, 4, pcclFloat32, 2, comm, NULL));
    ROW(pcclInvalidArgument, "root 7 is not a rank", comm, pcclBcast(f, 4, pcclFloat32, 7, comm, NULL));
    /* A stream with host buffers: the answer depends on the build (see stream_expectation
     * in tests/capi.rs): PCCL_TEST_STREAM_EXPECT = "code:message part". */
    const char *se = getenv("PCCL_TEST_STREAM_EXPECT");
    int scode = se ? atoi(se) : pcclInvalidUsage;
    const char *swant = se && strchr(se, ':') ? strchr(se, ':') + 1 : "built without CUDA";
    ROW(scode, swant, comm, pcclAllReduce(f, g, 4, pcclFloat32, pcclSum, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclAllGather(f, g, 2, pcclFloat32, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclReduceScatter(f, g, 2, pcclFloat32, pcclSum, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclBroadcast(f, g, 4, pcclFloat32, 0, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclBcast(f, 4, pcclFloat32, 0, comm, (void *)bytes));
    ROW(pcclInvalidArgument, "count is NULL", comm, pcclCommCount(comm, NULL));
    ROW(pcclInvalidArgument, "rank is NULL", comm, pcclCommUserRank(comm, NULL));
    ROW(pcclInvalidArgument, "comm is NULL", NULL, pcclCommUserRank(NULL, &out));
    ROW(pcclInvalidArgument, "version is NULL", NULL, pcclGetVersion(NULL));
    ROW(pcclInvalidArgument, "newcomm is NULL", comm, pcclCommSplit(comm, 0, 0, NULL));
    ROW(pcclInvalidArgument, "timeout must be positive", comm, pcclCommSetTimeout(comm, 0));
    ROW(pcclInvalidArgument, "timeout_ms is NULL", comm, pcclCommGetTimeout(comm, NULL));
    ROW(pcclInvalidArgument, "comm is NULL", NULL, pcclCommSetTimeout(NULL, 1000));


    /* ---- rooted collectives, all-to-all(v), point-to-point, groups ---- */
    size_t cnt[2] = {1, 1}, dsp[2] = {0, 1}, zero[2] = {0, 0};
    int other = 1 - r;
    ROW(pcclInvalidArgument, "NULL", comm, pcclReduce(NULL, g, 4, pcclFloat32, pcclSum, 0, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclReduce(f, NULL, 4, pcclFloat32, pcclSum, r, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclGather(NULL, g, 2, pcclFloat32, 0, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclGather(f, NULL, 2, pcclFloat32, r, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclScatter(NULL, g, 2, pcclFloat32, r, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclScatter(f, NULL, 2, pcclFloat32, 0, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclAllToAll(NULL, g, 2, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclAllToAll(f, NULL, 2, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclAllToAllv(NULL, cnt, dsp, g, cnt, dsp, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclAllToAllv(f, cnt, dsp, NULL, cnt, dsp, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclSend(NULL, 4, pcclFloat32, other, comm, NULL));
    ROW(pcclInvalidArgument, "NULL", comm, pcclRecv(NULL, 4, pcclFloat32, other, comm, NULL));
    ROW(pcclInvalidArgument, "root 2 is not a rank", comm, pcclReduce(f, g, 4, pcclFloat32, pcclSum, 2, comm, NULL));
    ROW(pcclInvalidArgument, "root -1 is not a rank", comm, pcclGather(f, g, 2, pcclFloat32, -1, comm, NULL));
    ROW(pcclInvalidArgument, "root 9 is not a rank", comm, pcclScatter(f, g, 2, pcclFloat32, 9, comm, NULL));
    ROW(pcclInvalidArgument, "op 7 is not a pcclRedOp_t", comm, pcclReduce(f, g, 4, pcclFloat32, 7, 0, comm, NULL));
    ROW(pcclInvalidArgument, "datatype 12 is not", comm, pcclAllToAll(f, g, 2, 12, comm, NULL));
    ROW(pcclInvalidArgument, "overflows", comm, pcclGather(d, d, SIZE_MAX / 2 + 1, pcclFloat64, r, comm, NULL));
    ROW(pcclInvalidArgument, "overflows", comm, pcclAllToAll(d, g, SIZE_MAX / 2 + 1, pcclFloat64, comm, NULL));
    ROW(pcclInvalidArgument, "overlap", comm, pcclAllToAll(f, f + 1, 2, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "peer 2 is not a rank", comm, pcclSend(f, 4, pcclFloat32, 2, comm, NULL));
    ROW(pcclInvalidArgument, "peer -1 is not a rank", comm, pcclRecv(g, 4, pcclFloat32, -1, comm, NULL));
    ROW(pcclInvalidArgument, "peer 5 is not a rank", comm, pcclIsend(f, 4, pcclFloat32, 5, comm, &req));
    ROW(pcclInvalidArgument, "request is NULL", comm, pcclIrecv(g, 4, pcclFloat32, other, comm, NULL));
    ROW(pcclInvalidArgument, "datatype 10 is not", comm, pcclSend(f, 4, 10, other, comm, NULL));
    ROW(pcclInvalidArgument, "sendcounts is NULL", comm, pcclAllToAllv(f, NULL, dsp, g, cnt, dsp, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "sdispls is NULL", comm, pcclAllToAllv(f, cnt, NULL, g, cnt, dsp, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "recvcounts is NULL", comm, pcclAllToAllv(f, cnt, dsp, g, NULL, dsp, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "rdispls is NULL", comm, pcclAllToAllv(f, cnt, dsp, g, cnt, NULL, pcclFloat32, comm, NULL));
    /* Every call but pcclIsend/pcclIrecv takes device memory with a stream, as the
     * collectives do (the same answer for host buffers). */
    ROW(scode, swant, comm, pcclReduce(f, g, 4, pcclFloat32, pcclSum, 0, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclGather(f, g, 2, pcclFloat32, 0, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclScatter(f, g, 2, pcclFloat32, 0, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclAllToAll(f, g, 2, pcclFloat32, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclAllToAllv(f, cnt, dsp, g, cnt, dsp, pcclFloat32, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclSend(f, 4, pcclFloat32, other, comm, (void *)bytes));
    ROW(scode, swant, comm, pcclRecv(g, 4, pcclFloat32, other, comm, (void *)bytes));
    ROW(pcclInvalidUsage, "without pcclGroupStart", NULL, pcclGroupEnd());
    pcclRequest_t greq = NULL;
    ROW(pcclInvalidUsage, "without pcclGroupStart", NULL, pcclGroupEndAsync(&greq));
    ROW(pcclSuccess, "", NULL, pcclGroupStart());
    ROW(pcclInvalidArgument, "request is NULL", NULL, pcclGroupEndAsync(NULL));
    ROW(pcclInvalidUsage, "without pcclGroupStart", NULL, pcclGroupEnd());
    ROW(pcclSuccess, "", NULL, pcclGroupStart());
    ROW(pcclInvalidUsage, "inside pcclGroupStart/pcclGroupEnd", comm, pcclReduce(f, g, 4, pcclFloat32, pcclSum, 0, comm, NULL));
    ROW(pcclInvalidUsage, "not supported inside a group", comm, pcclIsend(f, 4, pcclFloat32, other, comm, &req));
    /* A group's operations share one stream (here: host memory, then a stream). */
    ROW(pcclSuccess, "", comm, pcclSend(f, 1, pcclFloat32, r, comm, NULL));
    ROW(pcclInvalidUsage, "on another stream", comm, pcclRecv(g, 1, pcclFloat32, r, comm, (void *)bytes));
    ROW(pcclSuccess, "", comm, pcclRecv(g, 1, pcclFloat32, r, comm, NULL));
    ROW(pcclSuccess, "", NULL, pcclGroupEnd());
    ROW(pcclInvalidUsage, "without pcclGroupStart", NULL, pcclGroupEnd());
    ROW(pcclSuccess, "", comm, pcclReduce(f, r == 0 ? g : NULL, 4, pcclFloat32, pcclSum, 0, comm, NULL));
    ROW(pcclSuccess, "", comm, pcclAllToAllv(NULL, zero, zero, NULL, zero, zero, pcclFloat32, comm, NULL));

    /* ---- initialisation ---- */
    pcclThreadWorld_t w = NULL;
    ROW(pcclInvalidArgument, "nranks 0 is out of range", NULL, pcclThreadWorldCreate(0, &w));
    ROW(pcclInvalidArgument, "nranks -4 is out of range", NULL, pcclThreadWorldCreate(-4, &w));
    /* Hostile sizes are refused before anything is allocated for them (no OOM abort). */
    ROW(pcclInvalidArgument, "at most PCCL_MAX_RANKS (4194304)", NULL, pcclThreadWorldCreate(1 << 30, &w));
    ROW(pcclInvalidArgument, "nranks 4194305 is out of range", NULL,
        pcclThreadWorldCreate(PCCL_MAX_RANKS + 1, &w));
    ROW(pcclInvalidArgument, "at most PCCL_MAX_RANKS", NULL, pcclThreadWorldCreate(INT32_MAX, &w));
    ROW(pcclSuccess, "", NULL, pcclThreadWorldCreate(PCCL_MAX_RANKS, &w));
    ROW(pcclSuccess, "", NULL, pcclThreadWorldDestroy(w));
    pcclUniqueId zero_id;
    memset(&zero_id, 0, sizeof zero_id);
    ROW(pcclInvalidArgument, "at most PCCL_MAX_RANKS", NULL, pcclCommInitRank(&c2, 1 << 30, zero_id, 0));
    ROW(pcclInvalidArgument, "nranks -1 is out of range", NULL, pcclCommInitRank(&c2, -1, zero_id, 0));
    ROW(pcclInvalidArgument, "rank 2 of 2", NULL, pcclCommInitRank(&c2, 2, zero_id, 2));
    ROW(pcclInvalidArgument, "rank -1 of 2", NULL, pcclCommInitRank(&c2, 2, zero_id, -1));
    ROW(pcclInvalidArgument, "not a PCCL unique id", NULL, pcclCommInitRank(&c2, 2, zero_id, 1));
    ROW(pcclInvalidArgument, "comm is NULL", NULL, pcclCommInitRank(NULL, 2, zero_id, 1));
    ROW(pcclInvalidArgument, "world is NULL", NULL, pcclThreadWorldCreate(2, NULL));
    ROW(pcclInvalidArgument, "comm is NULL", NULL, pcclCommInitThreads(NULL, R->world, r));
    ROW(pcclInvalidArgument, "world is NULL", NULL, pcclCommInitThreads(&c2, NULL, r));
    ROW(pcclInvalidArgument, "rank 2 is not a rank of this world of 2", NULL, pcclCommInitThreads(&c2, R->world, 2));
    ROW(pcclInvalidArgument, "rank -1 is not a rank", NULL, pcclCommInitThreads(&c2, R->world, -1));
    ROW(pcclInvalidUsage, "already has (or is building) a communicator", NULL, pcclCommInitThreads(&c2, R->world, r));
    if (HAS_MPI)
        R->checks++;
    else
        ROW(pcclInvalidUsage, "built without MPI support", NULL, pcclCommInitMPI(&c2, 0));
    ROW(pcclInvalidArgument, "comm is NULL", NULL, pcclCommInitMPI(NULL, 0));

    /* ---- requests ---- */
    req = (pcclRequest_t)1;
    ROW(pcclInvalidArgument, "op avg is not defined", comm, pcclIallReduce(i32, i32, 4, pcclInt32, pcclAvg, comm, &req));
    R->checks++;
    if (req != NULL) fail(R, "a failed pcclIallReduce left *request = %p", (void *)req);
    ROW(pcclInvalidArgument, "request is NULL", comm, pcclIallGather(f, g, 2, pcclFloat32, comm, NULL));
    ROW(pcclInvalidArgument, "request is NULL", comm, pcclIbarrier(comm, NULL));
    ROW(pcclInvalidArgument, "request is NULL", NULL, pcclWait(NULL));
    ROW(pcclInvalidArgument, "never created by PCCL", NULL, pcclWait((pcclRequest_t)(uintptr_t)0x77));
    ROW(pcclSuccess, "", comm, pcclIbarrier(comm, &req));
    ROW(pcclInvalidArgument, "done is NULL", comm, pcclTest(req, NULL));
    ROW(pcclInvalidArgument, "is a request", NULL, pcclBarrier((pcclComm_t)req));
    ROW(pcclSuccess, "", comm, pcclWait(req));
    ROW(pcclInvalidUsage, "already completed and freed by pcclWait", NULL, pcclWait(req));
    ROW(pcclInvalidUsage, "already completed and freed by pcclWait", NULL, pcclTest(req, &out));

    /* ---- things that are fine ---- */
    ROW(pcclSuccess, "", comm, pcclAllReduce(NULL, NULL, 0, pcclFloat32, pcclSum, comm, NULL));
    ROW(pcclSuccess, "", comm, pcclAllGather(NULL, NULL, 0, pcclInt8, comm, NULL));
    ROW(pcclSuccess, "", comm, pcclBroadcast(r == 0 ? f : NULL, g, 4, pcclFloat32, 0, comm, NULL));

    /* ---- error strings ---- */
    R->checks++;
    for (pcclResult_t rc = 0; rc < pcclNumResults; rc++) {
        const char *s = pcclGetErrorString(rc);
        if (!s || !*s || strcmp(s, "unknown result code") == 0) fail(R, "no string for code %d", rc);
    }
    if (strcmp(pcclGetErrorString(pcclNumResults + 3), "unknown result code") != 0 ||
        strcmp(pcclGetErrorString(-1), "unknown result code") != 0)
        fail(R, "out-of-range codes are not 'unknown result code'");
    R->checks++;
    if (!strstr(pcclGetLastError(dead), "was destroyed") ||
        !strstr(pcclGetLastError((pcclComm_t)(uintptr_t)0x99), "never created by PCCL"))
        fail(R, "pcclGetLastError of a bad handle: \"%s\"", pcclGetLastError(dead));

    /* ---- the communicator still works after all that ---- */
    float one = 1.0f, sum = 0.0f;
    if (CALL(R, comm, pcclAllReduce(&one, &sum, 1, pcclFloat32, pcclSum, comm, NULL))) {
        R->checks++;
        if (sum != (float)R->nranks) fail(R, "allreduce after the bad calls gave %g", sum);
    }
    CALL(R, comm, pcclCommDestroy(comm));
}

/* Ranks that disagree: one calls a collective the other never calls, then destroys its
 * communicator (an error naming it: at once where the transport hears the goodbye, at the
 * timeout where it cannot), and counts that differ (an error on every rank, remote or timeout,
 * never a hang or a crash). */
static void rank_disagree(struct rank_ctx *R) {
    pcclComm_t comm = init_comm(R);
    if (!comm) return;
    if (R->rank == 0) {
        R->checks++;
        pcclResult_t rc = pcclBarrier(comm);
        const char *msg = pcclGetLastError(comm);
        int left = rc == pcclRemoteError && strstr(msg, "rank 1 left");
        int timed_out = rc == pcclTimeout && strstr(msg, "PCCL_TIMEOUT");
        if (!left && !timed_out)
            fail(R, "barrier alone returned %d: %s", rc, msg);
    }
    CALL(R, comm, pcclCommDestroy(comm));
}

static void rank_mismatch(struct rank_ctx *R) {
    pcclComm_t comm = init_comm(R);
    if (!comm) return;
    float buf[8] = {0};
    pcclResult_t rc = pcclAllReduce(buf, buf, R->rank == 0 ? 4 : 8, pcclFloat32, pcclSum, comm, NULL);
    R->checks++;
    if (rc != pcclRemoteError && rc != pcclTimeout)
        fail(R, "allreduce with mismatched counts returned %d: %s", rc, pcclGetLastError(comm));
    else if (rc == pcclRemoteError && !strstr(pcclGetLastError(comm), "same count and dtype"))
        fail(R, "mismatch message: %s", pcclGetLastError(comm));
    CALL(R, comm, pcclCommDestroy(comm));
}

/* One rank's bad argument (a misaligned buffer on rank 0 only): rank 0 gets
 * pcclInvalidArgument, the peer pcclRemoteError naming rank 0, at once; the ranks stay in step,
 * so the following all-reduces are correct on both (before the fix, rank 1's call paired with
 * rank 0's next one and later sums were wrong). */
static void rank_refuses(struct rank_ctx *R) {
    pcclComm_t comm = init_comm(R);
    if (!comm) return;
    float buf[9] = {0};
    float *bad = R->rank == 0 ? (float *)((char *)buf + 1) : buf;
    pcclResult_t rc = pcclAllReduce(bad, bad, 8, pcclFloat32, pcclSum, comm, NULL);
    R->checks++;
    if (R->rank == 0 && rc != pcclInvalidArgument)
        fail(R, "misaligned all-reduce returned %d: %s", rc, pcclGetLastError(comm));
    if (R->rank != 0 && (rc != pcclRemoteError || !strstr(pcclGetLastError(comm), "rank 0 refused")))
        fail(R, "the peer of a refused all-reduce returned %d: %s", rc, pcclGetLastError(comm));
    for (int round = 1; round <= 3; round++) {
        float mine[8], sum[8];
        for (int i = 0; i < 8; i++) mine[i] = (float)(round * (R->rank + 1) + i);
        if (!CALL(R, comm, pcclAllReduce(mine, sum, 8, pcclFloat32, pcclSum, comm, NULL))) break;
        R->checks++;
        for (int i = 0; i < 8; i++) {
            float want = (float)(round * 3 + 2 * i); /* ranks 1 and 2 of the formula, 2 ranks */
            if (sum[i] != want) {
                fail(R, "all-reduce %d after the refusal: element %d is %g, want %g", round, i,
                     sum[i], want);
                break;
            }
        }
    }
    CALL(R, comm, pcclCommDestroy(comm));
}

int main(int argc, char **argv) {
    HAS_MPI = argc > 1 && strcmp(argv[1], "mpi") == 0;
    int checks = 0, failures = 0;
    setenv("PCCL_TIMEOUT", "60", 1);
    failures += run_world(2, rank_main, NULL, &checks);
    /* No other thread of ours runs now, so changing the environment is safe. */
    setenv("PCCL_TIMEOUT", "2", 1);
    failures += run_world(2, rank_disagree, NULL, &checks);
    failures += run_world(2, rank_mismatch, NULL, &checks);
    failures += run_world(2, rank_refuses, NULL, &checks);
    printf("bad_input: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
