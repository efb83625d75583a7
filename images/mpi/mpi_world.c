/* mpi-world: checks an MPI world the way a benchmark would use it, and says what it saw.
 *
 * Every rank contributes rank + 1 to an allreduce (the sum must be size * (size + 1) / 2), passes its rank
 * around a ring (each must receive its predecessor's), and sends rank 0 its host name. Then the ranks time
 * `--iterations` allreduces of `--bytes` of doubles. Rank 0 prints one line per check and a summary line:
 *   mpi-world: library <first line of MPI_Get_library_version>
 *   mpi-world: hosts <host>=<ranks> ...
 *   mpi-world: ok size=<N> hosts=<H> allreduce=<sum> ring=ok bytes=<B> iterations=<I> mean_ms=<t>
 * It exits non-zero (MPI_Abort) when a check fails. Build: mpicc -O2 -o mpi-world mpi_world.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_LEN 256

static long parse_count(const char *flag, const char *value) {
  char *end = NULL;
  long n = strtol(value, &end, 10);
  if (end == value || *end != '\0' || n < 1) {
    fprintf(stderr, "mpi-world: %s wants a positive integer, got '%s'\n", flag, value);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return n;
}

static void fail(int rank, const char *what) {
  fprintf(stderr, "mpi-world: rank %d: %s\n", rank, what);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, len = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  long bytes = 1 << 22, iterations = 20;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc) {
      bytes = parse_count("--bytes", argv[++i]);
    } else if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = parse_count("--iterations", argv[++i]);
    } else {
      if (rank == 0) fprintf(stderr, "usage: mpi-world [--bytes N] [--iterations N]\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }

  long mine = rank + 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (sum != (long)size * (size + 1) / 2) fail(rank, "allreduce returned a wrong sum");

  int next = (rank + 1) % size, previous = (rank + size - 1) % size, received = -1;
  MPI_Sendrecv(&rank, 1, MPI_INT, next, 0, &received, 1, MPI_INT, previous, 0, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  if (received != previous) fail(rank, "the ring delivered another rank's token");

  char host[NAME_LEN] = {0};
  MPI_Get_processor_name(host, &len);
  char *hosts = rank == 0 ? calloc((size_t)size, NAME_LEN) : NULL;
  MPI_Gather(host, NAME_LEN, MPI_CHAR, hosts, NAME_LEN, MPI_CHAR, 0, MPI_COMM_WORLD);

  long count = bytes / (long)sizeof(double);
  if (count < 1) count = 1;
  double *send = malloc((size_t)count * sizeof(double)), *recv = malloc((size_t)count * sizeof(double));
  if (send == NULL || recv == NULL) fail(rank, "out of memory for the timed allreduce");
  for (long i = 0; i < count; i++) send[i] = rank + 1;
  MPI_Barrier(MPI_COMM_WORLD);
  double started = MPI_Wtime();
  for (long i = 0; i < iterations; i++) {
    MPI_Allreduce(send, recv, (int)count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  }
  double mean_ms = (MPI_Wtime() - started) * 1000.0 / (double)iterations;
  if (recv[count - 1] != (double)sum) fail(rank, "the timed allreduce returned a wrong sum");

  if (rank == 0) {
    char library[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    MPI_Get_library_version(library, &len);
    library[strcspn(library, "\r\n")] = '\0';
    printf("mpi-world: library %s\n", library);
    printf("mpi-world: hosts");
    int distinct = 0;
    for (int r = 0; r < size; r++) {
      const char *name = hosts + (size_t)r * NAME_LEN;
      int seen = 0, ranks = 0;
      for (int q = 0; q < r; q++) seen |= strcmp(name, hosts + (size_t)q * NAME_LEN) == 0;
      if (seen) continue;
      for (int q = r; q < size; q++) ranks += strcmp(name, hosts + (size_t)q * NAME_LEN) == 0;
      printf(" %s=%d", name, ranks);
      distinct++;
    }
    printf("\nmpi-world: ok size=%d hosts=%d allreduce=%ld ring=ok bytes=%ld iterations=%ld mean_ms=%.3f\n",
           size, distinct, sum, count * (long)sizeof(double), iterations, mean_ms);
    fflush(stdout);
    free(hosts);
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
