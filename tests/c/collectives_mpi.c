/* collectives.c as an MPI program: one process per rank, communicator from pcclCommInitMPI.
 * usage: mpiexec -n P collectives_mpi [quick]   (libpccl built with --features mpi) */
#define PCCL_TEST_MPI 1
#include "collectives.c"
