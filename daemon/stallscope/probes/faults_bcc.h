// Layouts of faults_bcc.c, read by faults_bcc.py from the compiled program.

#ifndef STALLSCOPE_FAULTS_BCC_H
#define STALLSCOPE_FAULTS_BCC_H

// User page faults of one thread in [start_ns, end_ns].
struct record {
    u64 start_ns;    // first fault
    u64 end_ns;      // last fault
    u32 pid;
    u32 tid;
    u32 count;
    u32 pad;
};

struct counters {
    u64 reserve_failed;   // ring buffer full
    u64 aggs_full;        // per-thread aggregate map full
};

#endif
