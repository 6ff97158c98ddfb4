// Definitions every kernel-cause program shares (faults_bcc.c, irq_bcc.c,
// syscalls_bcc.c): settings' defaults and the per-(thread, key) aggregate
// that the kernel closes when it is older than FLUSH_NS and user space
// sweeps when it goes idle. Only types and constants: bcc rewrites map
// calls in the main file alone, so the maps and the helpers that use them
// (the tracked filter, emit, COUNT) are written in each program.

#ifndef STALLSCOPE_KCAUSE_COMMON_H
#define STALLSCOPE_KCAUSE_COMMON_H

#include <uapi/linux/ptrace.h>

#ifndef MAX_TGIDS
#define MAX_TGIDS 4096
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 256
#endif

// Observe only: hand every event on to perf users too (see sched_bcc.c).
#define KEEP_PERF_EVENT 1

// One aggregate: events of one thread (and key) since start_ns.
struct agg {
    u64 start_ns;    // first event of the interval
    u64 last_ns;     // last event (or its end)
    u64 total_ns;    // summed time inside the events, when they have one
    u32 count;
    u32 pid;         // tgid
};

#endif
