/* Every collective x datatype x op of the C API on thread-ranks, out of place and in place,
 * blocking and non-blocking, plus split, against references computed here.
 *
 * usage: collectives NRANKS [quick]
 * (the node shape comes from PCCL_RANKS_PER_NODE in the environment; "quick" runs fewer
 * counts, for valgrind). Exits 0 when every check passed. */
#include "harness.h"

#include <sched.h>

static int QUICK = 0;

static const pcclDataType_t ALL_DTYPES[] = {pcclInt8,    pcclUint8,    pcclInt32,   pcclUint32,
                                            pcclInt64,   pcclUint64,   pcclFloat16, pcclBfloat16,
                                            pcclFloat32, pcclFloat64};
#define NUM_DTYPES ((int)(sizeof ALL_DTYPES / sizeof ALL_DTYPES[0]))
static const pcclRedOp_t ALL_OPS[] = {pcclSum, pcclProd, pcclMax, pcclMin, pcclAvg};
#define NUM_OPS ((int)(sizeof ALL_OPS / sizeof ALL_OPS[0]))

/* What rank r contributes at element i of a reduction with op (exact in every dtype: every
 * partial result is a small integer, so the reduction order cannot change a bit). */
static double red_value(pcclRedOp_t op, pcclDataType_t dt, int r, int p, size_t i) {
    long k;
    int sgn = dtype_is_signed(dt);
    switch (op) {
    case pcclSum:
        k = (long)((r * 7 + i * 3) % 11);
        return (double)(sgn ? k - 5 : k);
    case pcclProd:
        k = (long)((r + i) % 5);
        return k == 0 ? 2.0 : (k == 3 && sgn) ? -1.0 : 1.0;
    case pcclMax:
    case pcclMin:
        k = (long)((r * 13 + i * 7) % 23);
        return (double)(sgn ? k - 11 : k);
    default: { /* avg: offsets that sum to zero, so the average is exactly (i*5)%9 */
        double d = r < p - 1 ? (double)r : -(double)(p - 1) * (p - 2) / 2.0;
        return (double)((i * 5) % 9) + d;
    }
    }
}

static double red_ref(pcclRedOp_t op, pcclDataType_t dt, int p, size_t i) {
    double acc = red_value(op, dt, 0, p, i);
    for (int r = 1; r < p; r++) {
        double v = red_value(op, dt, r, p, i);
        switch (op) {
        case pcclSum: case pcclAvg: acc += v; break;
        case pcclProd: acc *= v; break;
        case pcclMax: acc = v > acc ? v : acc; break;
        default: acc = v < acc ? v : acc; break;
        }
    }
    return op == pcclAvg ? acc / p : acc;
}

/* What rank r contributes at element j of an all-gather or broadcast. */
static double gather_value(int r, size_t j) { return (double)((r * 31 + j * 7) % 100); }

static void check_elems(struct rank_ctx *R, const char *what, pcclDataType_t dt, pcclRedOp_t op,
                        size_t count, int inplace, const void *buf, size_t n,
                        double (*expect)(void *, size_t), void *arg) {
    R->checks++;
    for (size_t i = 0; i < n; i++) {
        double got = get_elem(buf, dt, i), want = expect(arg, i);
        if (got != want) {
            fail(R, "%s %s op=%s count=%zu inplace=%d: element %zu is %g, expected %g", what,
                 dtype_name(dt), op_name(op), count, inplace, i, got, want);
            return;
        }
    }
}

struct red_args { pcclRedOp_t op; pcclDataType_t dt; int p; size_t offset; };
static double red_expect(void *a, size_t i) {
    struct red_args *x = (struct red_args *)a;
    return red_ref(x->op, x->dt, x->p, x->offset + i);
}
struct own_args { pcclRedOp_t op; pcclDataType_t dt; int r, p; size_t offset; };
static double own_expect(void *a, size_t i) { /* a rank's own (unchanged) input */
    struct own_args *x = (struct own_args *)a;
    return red_value(x->op, x->dt, x->r, x->p, x->offset + i);
}
struct gather_args { size_t count; int root; };
static double gather_expect(void *a, size_t i) {
    struct gather_args *x = (struct gather_args *)a;
    return x->root >= 0 ? gather_value(x->root, i) : gather_value((int)(i / x->count), i % x->count);
}

static void test_all_reduce(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, pcclRedOp_t op,
                            size_t count, int inplace) {
    int r = R->rank, p = R->nranks;
    void *send = alloc_elems(dt, count);
    void *recv = inplace ? send : alloc_elems(dt, count);
    for (size_t i = 0; i < count; i++) set_elem(send, dt, i, red_value(op, dt, r, p, i));
    if (CALL(R, comm, pcclAllReduce(send, recv, count, dt, op, comm, NULL))) {
        struct red_args ra = {op, dt, p, 0};
        check_elems(R, "allreduce", dt, op, count, inplace, recv, count, red_expect, &ra);
        if (!inplace) {
            struct own_args oa = {op, dt, r, p, 0};
            check_elems(R, "allreduce sendbuff", dt, op, count, inplace, send, count, own_expect, &oa);
        }
    }
    if (!inplace) free(recv);
    free(send);
}

static void test_reduce_scatter(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt,
                                pcclRedOp_t op, size_t count, int inplace) {
    int r = R->rank, p = R->nranks;
    size_t es = dtype_size(dt);
    void *send = alloc_elems(dt, count * (size_t)p);
    void *recv = inplace ? (count ? (char *)send + (size_t)r * count * es : NULL) : alloc_elems(dt, count);
    for (size_t i = 0; i < count * (size_t)p; i++) set_elem(send, dt, i, red_value(op, dt, r, p, i));
    if (CALL(R, comm, pcclReduceScatter(send, recv, count, dt, op, comm, NULL))) {
        struct red_args ra = {op, dt, p, (size_t)r * count};
        check_elems(R, "reducescatter", dt, op, count, inplace, recv, count, red_expect, &ra);
    }
    if (!inplace) free(recv);
    free(send);
}

static void test_all_gather(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, size_t count,
                            int inplace) {
    int r = R->rank, p = R->nranks;
    size_t es = dtype_size(dt);
    void *recv = alloc_elems(dt, count * (size_t)p);
    void *send = inplace ? (count ? (char *)recv + (size_t)r * count * es : NULL) : alloc_elems(dt, count);
    for (size_t j = 0; j < count; j++) set_elem(send, dt, j, gather_value(r, j));
    if (CALL(R, comm, pcclAllGather(send, recv, count, dt, comm, NULL))) {
        struct gather_args ga = {count, -1};
        check_elems(R, "allgather", dt, pcclSum, count, inplace, recv, count * (size_t)p,
                    gather_expect, &ga);
    }
    if (!inplace) free(send);
    free(recv);
}

/* form 0: out of place (sendbuff NULL off the root), 1: in place, 2: pcclBcast. */
static void test_broadcast(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, size_t count,
                           int root, int form) {
    int r = R->rank;
    void *recv = alloc_elems(dt, count);
    void *send = form == 0 ? (r == root ? alloc_elems(dt, count) : NULL) : recv;
    if (r == root)
        for (size_t j = 0; j < count; j++) set_elem(send, dt, j, gather_value(root, j));
    pcclResult_t rc = form == 2 ? pcclBcast(recv, count, dt, root, comm, NULL)
                                : pcclBroadcast(send, recv, count, dt, root, comm, NULL);
    if (CALL(R, comm, rc)) {
        struct gather_args ga = {count, root};
        check_elems(R, form == 2 ? "bcast" : "broadcast", dt, pcclSum, count, form, recv, count,
                    gather_expect, &ga);
    }
    if (form == 0 && r == root) free(send);
    free(recv);
}

/* ---- rooted collectives, all-to-all(v), point-to-point ------------------------------------ */

/* form 0: out of place (unused buffers NULL off the root), 1: in place at the root. */
static void test_reduce(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, pcclRedOp_t op,
                        size_t count, int root, int form) {
    int r = R->rank, p = R->nranks;
    void *send = alloc_elems(dt, count);
    void *recv = r == root ? (form ? send : alloc_elems(dt, count)) : NULL;
    for (size_t i = 0; i < count; i++) set_elem(send, dt, i, red_value(op, dt, r, p, i));
    if (CALL(R, comm, pcclReduce(send, recv, count, dt, op, root, comm, NULL)) && r == root) {
        struct red_args ra = {op, dt, p, 0};
        check_elems(R, "reduce", dt, op, count, form, recv, count, red_expect, &ra);
    }
    if (r == root && !form) free(recv);
    free(send);
}

static void test_gather(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, size_t count,
                        int root, int form) {
    int r = R->rank, p = R->nranks;
    size_t es = dtype_size(dt);
    void *recv = r == root ? alloc_elems(dt, count * (size_t)p) : NULL;
    void *send = (r == root && form) ? (count ? (char *)recv + (size_t)r * count * es : NULL)
                                     : alloc_elems(dt, count);
    for (size_t j = 0; j < count; j++) set_elem(send, dt, j, gather_value(r, j));
    if (CALL(R, comm, pcclGather(send, recv, count, dt, root, comm, NULL)) && r == root) {
        struct gather_args ga = {count, -1};
        check_elems(R, "gather", dt, pcclSum, count, form, recv, count * (size_t)p, gather_expect,
                    &ga);
    }
    if (!(r == root && form)) free(send);
    free(recv);
}

static void test_scatter(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, size_t count,
                         int root, int form) {
    int r = R->rank, p = R->nranks;
    size_t es = dtype_size(dt);
    void *send = r == root ? alloc_elems(dt, count * (size_t)p) : NULL;
    void *recv = (r == root && form) ? (count ? (char *)send + (size_t)r * count * es : NULL)
                                     : alloc_elems(dt, count);
    if (r == root)
        for (size_t i = 0; i < count * (size_t)p; i++)
            set_elem(send, dt, i, gather_value((int)(i / count), i % count));
    if (CALL(R, comm, pcclScatter(send, recv, count, dt, root, comm, NULL))) {
        struct gather_args ga = {count, r};
        check_elems(R, "scatter", dt, pcclSum, count, form, recv, count, gather_expect, &ga);
    }
    if (!(r == root && form)) free(recv);
    free(send);
}

/* What rank i sends to rank j at element k of an all-to-all. */
static double a2a_value(int i, int j, size_t k) { return (double)((i * 17 + j * 5 + k * 3) % 100); }

static void test_all_to_all(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, size_t count) {
    int r = R->rank, p = R->nranks;
    size_t n = count * (size_t)p;
    void *send = alloc_elems(dt, n), *recv = alloc_elems(dt, n);
    for (int j = 0; j < p; j++)
        for (size_t k = 0; k < count; k++) set_elem(send, dt, (size_t)j * count + k, a2a_value(r, j, k));
    R->checks++;
    if (CALL(R, comm, pcclAllToAll(send, recv, count, dt, comm, NULL)))
        for (int i = 0; i < p; i++)
            for (size_t k = 0; k < count; k++) {
                double got = get_elem(recv, dt, (size_t)i * count + k), want = a2a_value(i, r, k);
                if (got != want) {
                    fail(R, "alltoall %s count=%zu: block %d element %zu is %g, expected %g",
                         dtype_name(dt), count, i, k, got, want);
                    i = p;
                    break;
                }
            }
    free(send);
    free(recv);
}

/* Elements rank i sends to rank j in the uneven all-to-all (some zero). */
static size_t a2av_count(int i, int j, size_t scale) { return ((size_t)(i + 2 * j) % 4) * scale; }

static void test_all_to_all_v(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, size_t scale) {
    int r = R->rank, p = R->nranks;
    size_t *sc = calloc((size_t)p, sizeof *sc), *sd = calloc((size_t)p, sizeof *sd);
    size_t *rc = calloc((size_t)p, sizeof *rc), *rd = calloc((size_t)p, sizeof *rd);
    size_t sn = 0, rn = 0;
    /* Send blocks in reverse rank order with a one-element gap; receive blocks in rank order. */
    for (int j = p - 1; j >= 0; j--) {
        sc[j] = a2av_count(r, j, scale);
        sd[j] = sn;
        sn += sc[j] + 1;
    }
    for (int i = 0; i < p; i++) {
        rc[i] = a2av_count(i, r, scale);
        rd[i] = rn;
        rn += rc[i];
    }
    void *send = alloc_elems(dt, sn), *recv = alloc_elems(dt, rn + 1);
    for (int j = 0; j < p; j++)
        for (size_t k = 0; k < sc[j]; k++) set_elem(send, dt, sd[j] + k, a2a_value(r, j, k));
    R->checks++;
    if (CALL(R, comm, pcclAllToAllv(send, sc, sd, recv, rc, rd, dt, comm, NULL)))
        for (int i = 0; i < p; i++)
            for (size_t k = 0; k < rc[i]; k++) {
                double got = get_elem(recv, dt, rd[i] + k), want = a2a_value(i, r, k);
                if (got != want) {
                    fail(R, "alltoallv %s scale=%zu: block from %d element %zu is %g, expected %g",
                         dtype_name(dt), scale, i, k, got, want);
                    i = p;
                    break;
                }
            }
    free(send);
    free(recv);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

/* A ring (send right, receive left) inside a (nested) group, then with pcclIsend/pcclIrecv. */
static void test_p2p(struct rank_ctx *R, pcclComm_t comm, pcclDataType_t dt, size_t count) {
    int r = R->rank, p = R->nranks;
    int right = (r + 1) % p, left = (r + p - 1) % p;
    void *send = alloc_elems(dt, count), *recv = alloc_elems(dt, count);
    for (size_t k = 0; k < count; k++) set_elem(send, dt, k, a2a_value(r, right, k));
    CALL(R, comm, pcclGroupStart());
    CALL(R, comm, pcclGroupStart());
    CALL(R, comm, pcclRecv(recv, count, dt, left, comm, NULL));
    CALL(R, comm, pcclGroupEnd());
    CALL(R, comm, pcclSend(send, count, dt, right, comm, NULL));
    if (CALL(R, comm, pcclGroupEnd())) {
        R->checks++;
        for (size_t k = 0; k < count; k++) {
            double got = get_elem(recv, dt, k), want = a2a_value(left, r, k);
            if (got != want) {
                fail(R, "group ring %s count=%zu: element %zu is %g, expected %g", dtype_name(dt),
                     count, k, got, want);
                break;
            }
        }
    }
    /* The same ring as one non-blocking group (pcclGroupEndAsync), finished by pcclWait. */
    if (count) memset(recv, 0x5a, count * dtype_size(dt));
    pcclRequest_t gr = NULL;
    CALL(R, comm, pcclGroupStart());
    CALL(R, comm, pcclSend(send, count, dt, right, comm, NULL));
    CALL(R, comm, pcclRecv(recv, count, dt, left, comm, NULL));
    if (CALL(R, comm, pcclGroupEndAsync(&gr))) {
        if (gr == NULL) {
            fail(R, "pcclGroupEndAsync %s count=%zu: no request", dtype_name(dt), count);
        } else if (CALL(R, comm, pcclWait(gr))) {
            R->checks++;
            for (size_t k = 0; k < count; k++) {
                double got = get_elem(recv, dt, k), want = a2a_value(left, r, k);
                if (got != want) {
                    fail(R, "async group ring %s count=%zu: element %zu is %g, expected %g",
                         dtype_name(dt), count, k, got, want);
                    break;
                }
            }
        }
    }
    /* A ring of separate pcclIsend/pcclIrecv (no group): separate non-blocking point-to-point
     * requests progress together, so every rank may post in either order (even ranks send
     * first, odd ranks receive first) with messages larger than any buffering. */
    if (p > 1) {
        if (count) memset(recv, 0x5a, count * dtype_size(dt));
        pcclRequest_t rs = NULL, rr = NULL;
        int a, b;
        if (r % 2 == 0) {
            a = CALL(R, comm, pcclIsend(send, count, dt, right, comm, &rs));
            b = CALL(R, comm, pcclIrecv(recv, count, dt, left, comm, &rr));
        } else {
            b = CALL(R, comm, pcclIrecv(recv, count, dt, left, comm, &rr));
            a = CALL(R, comm, pcclIsend(send, count, dt, right, comm, &rs));
        }
        int done = 0;
        if (b) CALL(R, comm, pcclTest(rr, &done));
        int d = b && CALL(R, comm, pcclWait(rr)); /* the receive first: the send may need it */
        int c = a && CALL(R, comm, pcclWait(rs));
        if (c && d) {
            R->checks++;
            for (size_t k = 0; k < count; k++)
                if (get_elem(recv, dt, k) != a2a_value(left, r, k)) {
                    fail(R, "isend/irecv ring %s count=%zu: element %zu is %g", dtype_name(dt),
                         count, k, get_elem(recv, dt, k));
                    break;
                }
        }
    }
    /* Plain blocking pairs: even ranks send first, odd ranks receive first. */
    if (p > 1 && (r ^ 1) < p) {
        int peer = r ^ 1;
        if (count) memset(recv, 0x5a, count * dtype_size(dt));
        int ok = r % 2 == 0 ? CALL(R, comm, pcclSend(send, count, dt, peer, comm, NULL)) &&
                                  CALL(R, comm, pcclRecv(recv, count, dt, peer, comm, NULL))
                            : CALL(R, comm, pcclRecv(recv, count, dt, peer, comm, NULL)) &&
                                  CALL(R, comm, pcclSend(send, count, dt, peer, comm, NULL));
        if (ok) {
            R->checks++;
            for (size_t k = 0; k < count; k++)
                if (get_elem(recv, dt, k) != a2a_value(peer, (peer + 1) % p, k)) {
                    fail(R, "send/recv pair %s count=%zu: element %zu is %g", dtype_name(dt),
                         count, k, get_elem(recv, dt, k));
                    break;
                }
        }
    }
    free(send);
    free(recv);
}

static void test_ops(struct rank_ctx *R, pcclComm_t comm) {
    static const pcclDataType_t dts_full[] = {pcclInt8, pcclUint32, pcclFloat16, pcclBfloat16,
                                              pcclFloat32, pcclFloat64, pcclInt64};
    static const pcclDataType_t dts_quick[] = {pcclFloat32, pcclInt64};
    static const size_t counts_full[] = {0, 1, 7, 300};
    static const size_t counts_quick[] = {0, 3};
    const pcclDataType_t *dts = QUICK ? dts_quick : dts_full;
    int ndts = QUICK ? 2 : 7;
    const size_t *counts = QUICK ? counts_quick : counts_full;
    int ncounts = QUICK ? 2 : 4;
    for (int d = 0; d < ndts; d++) {
        pcclDataType_t dt = dts[d];
        for (int c = 0; c < ncounts; c++) {
            size_t count = counts[c];
            for (int root = 0; root < R->nranks; root++)
                for (int form = 0; form < 2; form++) {
                    pcclRedOp_t op = (root + form) % 2 ? pcclMax : pcclSum;
                    test_reduce(R, comm, dt, op, count, root, form);
                    test_gather(R, comm, dt, count, root, form);
                    test_scatter(R, comm, dt, count, root, form);
                }
            test_all_to_all(R, comm, dt, count);
            test_p2p(R, comm, dt, count);
        }
        test_all_to_all_v(R, comm, dt, 1);
        if (!QUICK) test_all_to_all_v(R, comm, dt, 37);
    }
    if (!QUICK) {
        test_reduce(R, comm, pcclFloat32, pcclAvg, 5, R->nranks - 1, 0);
        test_reduce(R, comm, pcclInt32, pcclProd, 100000, 0, 1);
        test_gather(R, comm, pcclUint8, 50000, R->nranks / 2, 0);
        test_scatter(R, comm, pcclFloat64, 20000, R->nranks - 1, 1);
        test_all_to_all(R, comm, pcclInt32, 30000);
        test_p2p(R, comm, pcclUint8, 200000);
        test_p2p(R, comm, pcclUint8, 8 << 20); /* 8 MiB: more than any buffering */
    }
}

/* Several non-blocking collectives in flight at once, polled with pcclTest, waited out of
 * order. */
static void test_nonblocking(struct rank_ctx *R, pcclComm_t comm, size_t count) {
    int r = R->rank, p = R->nranks;
    pcclRequest_t req[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    float *ar = (float *)alloc_elems(pcclFloat32, count);
    int32_t *ag_in = (int32_t *)alloc_elems(pcclInt32, count);
    int32_t *ag_out = (int32_t *)alloc_elems(pcclInt32, count * (size_t)p);
    double *rs_in = (double *)alloc_elems(pcclFloat64, count * (size_t)p);
    double *rs_out = (double *)alloc_elems(pcclFloat64, count);
    uint8_t *bc = (uint8_t *)alloc_elems(pcclUint8, count);
    uint16_t *ar16 = (uint16_t *)alloc_elems(pcclBfloat16, count);
    int root = p - 1;
    for (size_t i = 0; i < count; i++) {
        set_elem(ar, pcclFloat32, i, red_value(pcclSum, pcclFloat32, r, p, i));
        set_elem(ag_in, pcclInt32, i, gather_value(r, i));
        if (r == root) set_elem(bc, pcclUint8, i, gather_value(root, i));
        set_elem(ar16, pcclBfloat16, i, red_value(pcclMax, pcclBfloat16, r, p, i));
    }
    for (size_t i = 0; i < count * (size_t)p; i++)
        set_elem(rs_in, pcclFloat64, i, red_value(pcclAvg, pcclFloat64, r, p, i));

    int ok = CALL(R, comm, pcclIallReduce(ar, ar, count, pcclFloat32, pcclSum, comm, &req[0]));
    ok &= CALL(R, comm, pcclIallGather(ag_in, ag_out, count, pcclInt32, comm, &req[1]));
    ok &= CALL(R, comm, pcclIreduceScatter(rs_in, rs_out, count, pcclFloat64, pcclAvg, comm, &req[2]));
    ok &= CALL(R, comm, pcclIbroadcast(bc, bc, count, pcclUint8, root, comm, &req[3]));
    ok &= CALL(R, comm, pcclIbarrier(comm, &req[4]));
    ok &= CALL(R, comm, pcclIallReduce(ar16, ar16, count, pcclBfloat16, pcclMax, comm, &req[5]));
    if (!ok) return; /* a failed start would leave the other ranks waiting */

    int done = 0;
    pcclResult_t rc = pcclSuccess;
    while (!done && rc == pcclSuccess) {
        rc = pcclTest(req[4], &done);
        if (!done) sched_yield();
    }
    CALL(R, comm, rc);
    for (int k = 5; k >= 0; k--) CALL(R, comm, pcclWait(req[k]));

    struct red_args sum = {pcclSum, pcclFloat32, p, 0};
    check_elems(R, "iallreduce", pcclFloat32, pcclSum, count, 1, ar, count, red_expect, &sum);
    struct gather_args ga = {count, -1};
    check_elems(R, "iallgather", pcclInt32, pcclSum, count, 0, ag_out, count * (size_t)p,
                gather_expect, &ga);
    struct red_args avg = {pcclAvg, pcclFloat64, p, (size_t)r * count};
    check_elems(R, "ireducescatter", pcclFloat64, pcclAvg, count, 0, rs_out, count, red_expect, &avg);
    struct gather_args gb = {count, root};
    check_elems(R, "ibroadcast", pcclUint8, pcclSum, count, 1, bc, count, gather_expect, &gb);
    struct red_args mx = {pcclMax, pcclBfloat16, p, 0};
    check_elems(R, "iallreduce", pcclBfloat16, pcclMax, count, 1, ar16, count, red_expect, &mx);
    free(ar); free(ag_in); free(ag_out); free(rs_in); free(rs_out); free(bc); free(ar16);
}

/* Split by parity with keys reversing the order; then a split where rank 0 opts out. */
static void test_split(struct rank_ctx *R, pcclComm_t comm) {
    int r = R->rank, p = R->nranks;
    pcclComm_t sub = NULL;
    if (!CALL(R, comm, pcclCommSplit(comm, r % 2, -r, &sub))) return;
    int members = (p - r % 2 + 1) / 2, want_rank = 0;
    for (int q = r % 2; q < p; q += 2) want_rank += q > r; /* members with larger ranks come first */
    int n = -1, me = -1;
    CALL(R, sub, pcclCommCount(sub, &n));
    CALL(R, sub, pcclCommUserRank(sub, &me));
    R->checks++;
    if (n != members || me != want_rank)
        fail(R, "split: got rank %d of %d, expected %d of %d", me, n, want_rank, members);
    int64_t v = r, total = 0;
    if (CALL(R, sub, pcclAllReduce(&v, &total, 1, pcclInt64, pcclSum, sub, NULL))) {
        int64_t want = 0;
        for (int q = r % 2; q < p; q += 2) want += q;
        R->checks++;
        if (total != want) fail(R, "split allreduce: %lld, expected %lld", (long long)total, (long long)want);
    }
    CALL(R, sub, pcclCommDestroy(sub));

    pcclComm_t rest = (pcclComm_t)1; /* must be overwritten */
    if (!CALL(R, comm, pcclCommSplit(comm, r == 0 ? PCCL_SPLIT_NOCOLOR : 7, 0, &rest))) return;
    R->checks++;
    if (r == 0) {
        if (rest != NULL) fail(R, "split with NOCOLOR returned a communicator");
    } else if (rest == NULL) {
        fail(R, "split with color 7 returned NULL");
    } else {
        CALL(R, rest, pcclBarrier(rest));
        CALL(R, rest, pcclCommDestroy(rest));
    }
}

#ifdef PCCL_TEST_MPI
#include <mpi.h>
/* One MPI process per rank: the communicator comes from MPI_COMM_WORLD's Fortran handle. */
static pcclComm_t init_comm_mpi(struct rank_ctx *r) {
    pcclComm_t comm = NULL;
    if (!CALL(r, NULL, pcclCommInitMPI(&comm, (int)MPI_Comm_c2f(MPI_COMM_WORLD)))) return NULL;
    return comm;
}
#else
static pcclComm_t init_comm_mpi(struct rank_ctx *r) {
    (void)r;
    return NULL;
}
#endif

static void rank_main(struct rank_ctx *R) {
    pcclComm_t comm = R->world ? init_comm(R) : init_comm_mpi(R);
    if (!comm) return;
    int n = -1, me = -1, version = 0;
    CALL(R, comm, pcclCommCount(comm, &n));
    CALL(R, comm, pcclCommUserRank(comm, &me));
    CALL(R, comm, pcclGetVersion(&version));
    R->checks++;
    if (n != R->nranks || me != R->rank || version != PCCL_VERSION_CODE)
        fail(R, "count %d rank %d version %d", n, me, version);

    static const size_t counts_full[] = {0, 1, 5, 300};
    static const size_t counts_quick[] = {0, 3};
    const size_t *counts = QUICK ? counts_quick : counts_full;
    int ncounts = QUICK ? 2 : 4;
    for (int d = 0; d < NUM_DTYPES; d++) {
        pcclDataType_t dt = ALL_DTYPES[d];
        for (int c = 0; c < ncounts; c++) {
            size_t count = counts[c];
            for (int o = 0; o < NUM_OPS; o++) {
                pcclRedOp_t op = ALL_OPS[o];
                if (op == pcclAvg && !dtype_is_float(dt)) continue; /* rejected: see bad_input.c */
                for (int inplace = 0; inplace < 2; inplace++) {
                    test_all_reduce(R, comm, dt, op, count, inplace);
                    test_reduce_scatter(R, comm, dt, op, count, inplace);
                }
            }
            for (int inplace = 0; inplace < 2; inplace++) test_all_gather(R, comm, dt, count, inplace);
            for (int form = 0; form < 3; form++) {
                test_broadcast(R, comm, dt, count, 0, form);
                if (R->nranks > 1) test_broadcast(R, comm, dt, count, R->nranks - 1, form);
            }
        }
    }
    if (!QUICK) {
        /* Large enough to be cut into pipelined pieces (PCCL_CHUNK_SIZE). */
        test_all_reduce(R, comm, pcclFloat32, pcclSum, 150000, 0);
        test_reduce_scatter(R, comm, pcclBfloat16, pcclMax, 40000, 1);
        test_all_gather(R, comm, pcclUint8, 70000, 1);
    }
    test_nonblocking(R, comm, QUICK ? 4 : 1000);
    test_ops(R, comm);
    test_split(R, comm);
    CALL(R, comm, pcclBarrier(comm));
    CALL(R, comm, pcclCommDestroy(comm));
}

#ifdef PCCL_TEST_MPI
/* usage: mpiexec -n P collectives_mpi [quick] */
int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    struct rank_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ctx.nranks);
    QUICK = argc > 1 && strcmp(argv[1], "quick") == 0;
    rank_main(&ctx);
    int totals[2] = {ctx.checks, ctx.failures}, sums[2] = {0, 0};
    MPI_Reduce(totals, sums, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (ctx.rank == 0) {
        const char *rpn = getenv("PCCL_RANKS_PER_NODE");
        printf("collectives (MPI): %d processes, PCCL_RANKS_PER_NODE=%s%s: %d checks, %d failed\n",
               ctx.nranks, rpn ? rpn : "(unset)", QUICK ? " (quick)" : "", sums[0], sums[1]);
    }
    MPI_Finalize();
    return sums[1] == 0 ? 0 : 1;
}
#else
int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s NRANKS [quick]\n", argv[0]);
        return 2;
    }
    int p = atoi(argv[1]);
    QUICK = argc > 2 && strcmp(argv[2], "quick") == 0;
    int checks = 0;
    int failures = run_world(p, rank_main, NULL, &checks);
    const char *rpn = getenv("PCCL_RANKS_PER_NODE");
    printf("collectives: %d ranks, PCCL_RANKS_PER_NODE=%s%s: %d checks, %d failed\n", p,
           rpn ? rpn : "(unset)", QUICK ? " (quick)" : "", checks, failures);
    return failures == 0 ? 0 : 1;
}
#endif
