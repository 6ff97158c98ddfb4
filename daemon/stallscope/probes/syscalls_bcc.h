// Layouts of syscalls_bcc.c, read by syscalls_bcc.py from the compiled program.

#ifndef STALLSCOPE_SYSCALLS_BCC_H
#define STALLSCOPE_SYSCALLS_BCC_H

// One syscall of at least THRESHOLD_NS (count = 1, [start_ns, end_ns] its
// entry and exit), or the calls of one (thread, syscall) shorter than that,
// summed over [start_ns, end_ns] (first entry, last exit).
struct record {
    u64 start_ns;
    u64 end_ns;
    u64 total_ns;    // time inside the calls
    u32 pid;
    u32 tid;
    u32 nr;          // syscall number
    u32 count;
};

// Key of an aggregate of short calls.
struct sc_key {
    u32 tid;
    u32 nr;
};

// A call in flight, per thread.
struct sc_enter {
    u64 start_ns;
    u32 nr;
    u32 pid;
};

struct counters {
    u64 reserve_failed;   // ring buffer full
    u64 aggs_full;        // aggregate map full
    u64 inflight_full;    // in-flight map full
};

#endif
