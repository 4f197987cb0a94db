/* pcclCommInitMPI from a real MPI program (one process per rank): build a communicator from
 * MPI_COMM_WORLD's Fortran handle, run each collective once against MPI's own rank/size,
 * split it, and tear down before MPI_Finalize.
 *
 * usage: mpiexec -n P mpi_init   (needs libpccl built with --features mpi) */
#include "pccl.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0, checks = 0;

#define EXPECT(cond, ...)                                                                      \
    do {                                                                                       \
        checks++;                                                                              \
        if (!(cond)) {                                                                         \
            failures++;                                                                        \
            fprintf(stderr, "FAIL line %d: ", __LINE__);                                       \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
        }                                                                                      \
    } while (0)

#define OK(comm, call)                                                                         \
    do {                                                                                       \
        pcclResult_t rc_ = (call);                                                             \
        EXPECT(rc_ == pcclSuccess, "%s returned %d: %s", #call, rc_, pcclGetLastError(comm)); \
    } while (0)

int main(int argc, char **argv) {
    int provided = 0, mrank = 0, msize = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mrank);
    MPI_Comm_size(MPI_COMM_WORLD, &msize);

    pcclComm_t comm = NULL;
    OK(NULL, pcclCommInitMPI(&comm, (int)MPI_Comm_c2f(MPI_COMM_WORLD)));
    if (!comm) {
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    int n = -1, r = -1;
    OK(comm, pcclCommCount(comm, &n));
    OK(comm, pcclCommUserRank(comm, &r));
    EXPECT(n == msize && r == mrank, "pccl rank %d of %d, MPI rank %d of %d", r, n, mrank, msize);

    double x = mrank + 1, sum = 0;
    OK(comm, pcclAllReduce(&x, &sum, 1, pcclFloat64, pcclSum, comm, NULL));
    EXPECT(sum == msize * (msize + 1) / 2.0, "allreduce sum %g", sum);

    int32_t *all = (int32_t *)calloc((size_t)msize * 3, sizeof *all);
    int32_t mine[3] = {mrank, 10 * mrank, 100 * mrank};
    OK(comm, pcclAllGather(mine, all, 3, pcclInt32, comm, NULL));
    for (int q = 0; q < msize; q++)
        EXPECT(all[3 * q] == q && all[3 * q + 2] == 100 * q, "allgather block %d", q);

    float *grads = (float *)malloc(sizeof(float) * 2 * (size_t)msize), avg[2] = {0, 0};
    for (int i = 0; i < 2 * msize; i++) grads[i] = (float)(mrank + i);
    OK(comm, pcclReduceScatter(grads, avg, 2, pcclFloat32, pcclAvg, comm, NULL));
    float want = (float)(msize - 1) / 2.0f + (float)(2 * mrank);
    EXPECT(avg[0] == want, "reduce-scatter avg %g, expected %g", avg[0], want);

    int64_t b[4] = {0, 0, 0, 0};
    if (mrank == msize - 1) memcpy(b, (int64_t[4]){7, 8, 9, 10}, sizeof b);
    pcclRequest_t req = NULL;
    OK(comm, pcclIbroadcast(b, b, 4, pcclInt64, msize - 1, comm, &req));
    OK(comm, pcclWait(req));
    EXPECT(b[0] == 7 && b[3] == 10, "ibroadcast gave %lld..%lld", (long long)b[0], (long long)b[3]);

    pcclComm_t half = NULL;
    OK(comm, pcclCommSplit(comm, mrank % 2, 0, &half));
    int hn = -1;
    OK(half, pcclCommCount(half, &hn));
    EXPECT(hn == (msize + 1 - mrank % 2) / 2, "split size %d", hn);
    OK(half, pcclBarrier(half));
    OK(half, pcclCommDestroy(half));
    OK(comm, pcclBarrier(comm));
    OK(comm, pcclCommDestroy(comm));
    free(all);
    free(grads);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (mrank == 0) printf("mpi_init: %d ranks: %d checks, %d failed\n", msize, checks, total);
    MPI_Finalize();
    return total == 0 ? 0 : 1;
}
