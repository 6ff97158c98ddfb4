// Layouts of cuda_bcc.c, read by cuda_bcc.py from the compiled program.

#ifndef STALLSCOPE_CUDA_BCC_H
#define STALLSCOPE_CUDA_BCC_H

// What an entry point is (cuda_calls.kind); user space reads these names.
#define CU_KIND_LAUNCH 0
#define CU_KIND_SYNC 1
#define CU_KIND_POLL 2   // cuEventQuery/cuStreamQuery: a polling loop
#define CU_KIND_COPY 3

// CUresult of a query whose work is not done yet.
#define CU_NOT_READY 600

// One call of at least THRESHOLD_NS (count = 1, [start_ns, end_ns] its entry
// and return, ip the entry point), or the calls of one (thread, kind)
// shorter than that, summed over [start_ns, end_ns] (ip 0).
struct record {
    u64 start_ns;
    u64 end_ns;
    u64 total_ns;    // time inside the calls
    u64 ip;          // entry point of an exact call (user address), else 0
    u32 pid;
    u32 tid;
    u32 kind;
    u32 count;       // calls (polling loops for CU_KIND_POLL)
    u32 calls;       // driver calls (the queries of polling loops)
    u32 pad;
};

// Key of an aggregate of short calls.
struct cu_key {
    u32 tid;
    u32 kind;
};

// A call in flight, per thread (probed calls inside it only deepen it).
struct cu_call {
    u64 start_ns;
    u64 ip;
    u32 pid;
    u32 kind;
    u32 depth;
    u32 pad;
};

// A polling loop in progress, per thread: queries answered "not ready".
struct cu_poll {
    u64 start_ns;    // entry of its first query
    u64 last_ns;     // return of its latest
    u64 ip;
    u32 pid;
    u32 queries;
};

// Short calls of one (thread, kind), and the driver calls among them.
struct cu_agg {
    u64 start_ns;
    u64 last_ns;
    u64 total_ns;
    u32 count;
    u32 pid;
    u32 calls;
    u32 pad;
};

struct counters {
    u64 reserve_failed;   // ring buffer full
    u64 aggs_full;        // aggregate map full
    u64 inflight_full;    // in-flight map full
};

#endif
