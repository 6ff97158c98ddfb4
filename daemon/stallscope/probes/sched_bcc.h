// Layouts shared by sched_bcc.c and its reader, sched_bcc.py: the one source.
//
// The reader takes each struct's numpy dtype from the compiled program (the
// `layout_record` map's value type and the `counters` map's value type), so
// a field added, moved or resized here reaches Python with it; a field the
// reader uses but this header lacks is a load-time error (bpf_common.py).

#ifndef STALLSCOPE_SCHED_BCC_H
#define STALLSCOPE_SCHED_BCC_H

#define KIND_SWITCH_IN 1
#define KIND_MIGRATE 2

#define COMM_LEN 16

// One per switch-in of a tracked thread, or per real migration.
struct record {
    u64 a_ns;        // switch-in: switched out at (0 = not seen); migrate: ts
    u64 b_ns;        // switch-in: became runnable at (0 = no run-queue wait seen)
    u64 c_ns;        // switch-in: switched in at
    u32 pid;         // tgid
    u32 tid;
    u16 cpu_a;       // switch-in: CPU it left; migrate: from
    u16 cpu_b;       // switch-in: CPU it runs on; migrate: to
    u8 kind;
    u8 preempted;    // switch-in: the switch-out was involuntary
    u8 other_irq;    // blocked: woken from interrupt context (no waker thread)
    u8 yielded;      // preempted inside sched_yield(): the thread gave its CPU
                     // away itself (1), or not (0); 0 also when the program
                     // was built without sched_yield's number (YIELD_NR;
                     // user space then writes NULL)
    // preempted: the task switched in in its place (sched_switch next_*);
    // blocked: the thread that woke it (sched_waking, in the waker's context).
    // other_pid is 0 when the kernel side could not tell the tgid.
    u32 other_tid;
    u32 other_pid;
    char other_comm[COMM_LEN];
    // switch-in: the task that held the CPU until now (the current task at
    // this sched_switch: whatever ran there while the thread was away, which
    // may have left the caches cold) and how long it had run there since its
    // own switch-in. prev_pid is its tgid (0: the idle task); prev_run_ns is
    // 0 when its switch-in was not seen (the program loaded meanwhile).
    u32 prev_pid;
    u32 pad2;
    u64 prev_run_ns;
    char prev_comm[COMM_LEN];
};

// Loss counters, one u64 each, read by name from user space.
struct counters {
    u64 reserve_failed;       // ring buffer full: record dropped
    u64 state_full;           // per-thread state map full
    u64 lost_in_preempted;    // switch-in never seen: preempted interval lost
    u64 lost_in_voluntary;    // same, for an interval after a voluntary switch
};

// Per summarised thread (one slot of the mmapped `summaries` array; the
// `summarised` map gives a tid its slot): running totals since the slot was
// given, only ever added to by the kernel; user space reads them without a
// syscall and writes the differences between two reads as rows. Every field
// is a u64 (the reader takes the dtype from the compiled map).
struct summary {
    u64 tid;           // the thread these totals belong to (the last writer)
    u64 oncpu_ns;      // switch-in to switch-out, summed at the switch-out
    u64 offcpu_ns;     // switch-out to switch-in, summed at the switch-in
    u64 preempted_ns;  // of which after an involuntary switch-out
    u64 runq_ns;       // runnable to switch-in, summed at the switch-in
    u64 switches;      // switch-ins (off-CPU intervals ended)
    u64 preemptions;   // of which after an involuntary switch-out
    u64 migrations;    // real CPU changes
    u64 in_ns;         // last switch-in (0: off CPU or not seen yet)
};

#endif
