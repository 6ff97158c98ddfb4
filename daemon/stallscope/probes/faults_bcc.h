// Layouts of faults_bcc.c, read by faults_bcc.py from the compiled program.

#ifndef STALLSCOPE_FAULTS_BCC_H
#define STALLSCOPE_FAULTS_BCC_H

// User page faults of one thread in [start_ns, end_ns].
struct record {
    u64 start_ns;     // first fault
    u64 end_ns;       // last fault
    u64 measured_ns;  // summed time of the measured faults (on-CPU; faults_bcc.c says to where)
    u32 pid;
    u32 tid;
    u32 count;        // faults
    u32 measured;     // faults whose time was measured
};

// One thread's faults since start_ns, and its latest fault while its time
// is still being measured (open).
struct fault_agg {
    u64 start_ns;     // first fault of the interval
    u64 last_ns;      // latest fault (entry)
    u64 measured_ns;  // measured faults' summed time
    u64 open_ns;      // on-CPU time so far of the open fault
    u64 seg_ns;       // since when the thread is on CPU with it open (0: off CPU)
    u64 map_ns;       // on-CPU time of the open fault when it mapped its page (0: not yet)
    u64 ip;           // the open fault's user instruction address
    u32 count;
    u32 measured;
    u32 pid;          // tgid
    u32 open;         // 1 while the latest fault's time runs
};

struct counters {
    u64 reserve_failed;   // ring buffer full
    u64 aggs_full;        // per-thread aggregate map full
    u64 ended_at_map;     // measured faults whose time ended at their page's mapping
    u64 ended_at_next;    // measured faults whose time ended at the thread's next fault
};

#endif
