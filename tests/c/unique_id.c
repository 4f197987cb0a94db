/* NCCL-style bootstrap from C: one pcclGetUniqueId, then pcclCommInitRank on every rank (here
 * threads; across hosts, processes), then collectives over the TCP / shared-memory transport. */
#define _POSIX_C_SOURCE 200809L
#include <pccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NRANKS 4
#define COUNT 100003

static pcclUniqueId id;
static int failures = 0, checks = 0;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void check(int ok, int rank, const char *what) {
    pthread_mutex_lock(&mu);
    checks++;
    if (!ok) {
        failures++;
        fprintf(stderr, "rank %d: %s failed\n", rank, what);
    }
    pthread_mutex_unlock(&mu);
}

static void *rank_main(void *arg) {
    int rank = (int)(long)arg;
    pcclComm_t comm = NULL;
    pcclResult_t rc = pcclCommInitRank(&comm, NRANKS, id, rank);
    check(rc == pcclSuccess, rank, pcclGetLastError(NULL));
    if (rc != pcclSuccess) return NULL;
    int n = 0, me = -1;
    check(pcclCommCount(comm, &n) == pcclSuccess && n == NRANKS, rank, "pcclCommCount");
    check(pcclCommUserRank(comm, &me) == pcclSuccess && me == rank, rank, "pcclCommUserRank");
    float *send = malloc(sizeof(float) * COUNT), *recv = malloc(sizeof(float) * COUNT * NRANKS);
    for (int i = 0; i < COUNT; i++) send[i] = (float)(rank + i % 3);
    check(pcclAllGather(send, recv, COUNT, pcclFloat32, comm, NULL) == pcclSuccess, rank, "pcclAllGather");
    int ok = 1;
    for (int r = 0; r < NRANKS; r++)
        for (int i = 0; i < COUNT; i++) ok &= recv[(size_t)r * COUNT + i] == (float)(r + i % 3);
    check(ok, rank, "all-gather result");
    check(pcclAllReduce(send, send, COUNT, pcclFloat32, pcclSum, comm, NULL) == pcclSuccess, rank, "pcclAllReduce");
    ok = 1;
    for (int i = 0; i < COUNT; i++) ok &= send[i] == (float)(0 + 1 + 2 + 3 + NRANKS * (i % 3));
    check(ok, rank, "all-reduce result");
    check(pcclBarrier(comm) == pcclSuccess, rank, "pcclBarrier");
    /* The survivors' agreement with nobody missing keeps every rank. */
    check(pcclCommShrinkSurvivors(comm, NULL) == pcclInvalidArgument, rank, "NULL newcomm is rejected");
    pcclComm_t all = NULL;
    int nall = 0;
    check(pcclCommShrinkSurvivors(comm, &all) == pcclSuccess && all != NULL, rank, "pcclCommShrinkSurvivors");
    check(all && pcclCommCount(all, &nall) == pcclSuccess && nall == NRANKS, rank, "survivors are all ranks");
    if (all) {
        float one = 1.0f;
        check(pcclAllReduce(&one, &one, 1, pcclFloat32, pcclSum, all, NULL) == pcclSuccess && one == (float)NRANKS,
              rank, "all-reduce on the survivors' communicator");
        check(pcclCommDestroy(all) == pcclSuccess, rank, "pcclCommDestroy (survivors)");
    }
    /* An explicit shrink without the last rank, which does not take part. */
    if (rank != NRANKS - 1) {
        int excluded[1] = {NRANKS - 1};
        pcclComm_t sub = NULL;
        int nsub = 0;
        check(pcclCommShrink(comm, excluded, 1, &sub) == pcclSuccess && sub != NULL, rank, "pcclCommShrink");
        check(sub && pcclCommCount(sub, &nsub) == pcclSuccess && nsub == NRANKS - 1, rank, "shrunk size");
        if (sub) check(pcclCommDestroy(sub) == pcclSuccess, rank, "pcclCommDestroy (shrunk)");
    }
    check(pcclCommDestroy(comm) == pcclSuccess, rank, "pcclCommDestroy");
    free(send);
    free(recv);
    return NULL;
}

int main(void) {
    if (pcclGetUniqueId(&id) != pcclSuccess) {
        fprintf(stderr, "pcclGetUniqueId: %s\n", pcclGetLastError(NULL));
        return 1;
    }
    check(pcclGetUniqueId(NULL) == pcclInvalidArgument, -1, "NULL unique id is rejected");
    pcclComm_t bad = NULL;
    check(pcclCommInitRank(&bad, 2, id, 5) == pcclInvalidArgument && bad == NULL, -1, "rank >= nranks is rejected");
    pthread_t t[NRANKS];
    for (long r = 0; r < NRANKS; r++) pthread_create(&t[r], NULL, rank_main, (void *)r);
    for (int r = 0; r < NRANKS; r++) pthread_join(t[r], NULL);
    printf("unique_id: %d checks, %d failed\n", checks, failures);
    return failures != 0;
}
