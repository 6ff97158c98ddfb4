// Pipe ping-pong between two processes pinned to one CPU: every round trip
// is two context switches, each with its wakeup. Prints "ready PID PID",
// waits for a byte on stdin (so a probe can be told to track them), runs,
// then prints the median-free total: "ns_per_round N".
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 100000;
    int cpu = argc > 2 ? atoi(argv[2]) : 0;
    int ab[2], ba[2];
    char c = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
    if (pipe(ab) || pipe(ba))
        return 1;
    pid_t child = fork();
    if (child == 0) {
        for (long i = 0; i < rounds; i++) {
            if (read(ab[0], &c, 1) != 1) _exit(1);
            if (write(ba[1], &c, 1) != 1) _exit(1);
        }
        _exit(0);
    }
    printf("ready %d %d\n", getpid(), child);
    fflush(stdout);
    if (read(0, &c, 1) != 1)
        return 1;
    long long t0 = now_ns();
    for (long i = 0; i < rounds; i++) {
        if (write(ab[1], &c, 1) != 1) return 1;
        if (read(ba[0], &c, 1) != 1) return 1;
    }
    long long t1 = now_ns();
    waitpid(child, NULL, 0);
    printf("ns_per_round %.1f\n", (double)(t1 - t0) / rounds);
    return 0;
}
