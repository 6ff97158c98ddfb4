// User page faults of tracked threads, and the time each took, per thread in
// the kernel.
//
// exceptions:page_fault_user runs in the faulting task's context, on entry
// only (no end event on this kernel; fexit on the fault handler would give
// the end exactly but BPF trampolines are refused here). So a fault's time
// is measured as the thread's on-CPU time from its entry to the thread's next
// fault: in a burst of first touches that is the fault and the few
// instructions that lead to the next one. The clock pauses while the thread
// is off CPU (sched_switch out, preempted or in uninterruptible sleep, e.g.
// a fault waiting for I/O) and resumes when it runs again. A fault's time is
// "measured" when that on-CPU time is at most GAP_NS; a longer one, or one
// that ends in an interruptible sleep (the thread left the fault and made a
// system call) or with the aggregate's flush, is counted but not measured:
// user space prices it at the mean of the measured ones (faults_bcc.py).
//
// Faults of one thread are summed into one aggregate; when a fault comes
// more than FLUSH_NS after the aggregate's first one, the aggregate is
// written to the ring as one record and a new one starts. User space flushes
// aggregates that went idle. CALIB_TID (set by user space) counts the faults
// of one thread of the daemon while it calibrates its fallback cost.

#include "faults_bcc.h"
#include "kcause_common.h"

#ifndef FLUSH_NS
#define FLUSH_NS 20000000
#endif
#ifndef MAX_TIDS
#define MAX_TIDS 16384
#endif

// >>> shared preamble: the pieces every kernel-cause program has, byte for
// byte (bcc rewrites map calls only in the main file, so they cannot live in
// kcause_common.h; tests/probes/test_bcc_shared.py checks the copies agree)
BPF_HASH(tracked, u32, u8, MAX_TGIDS);        // tgids to follow (user space)
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
BPF_F_TABLE("array", u32, struct counters, counters, 1, BPF_F_MMAPABLE);
// Never written: its value type tells user space the compiled record layout.
BPF_ARRAY(layout_record, struct record, 1);

static __always_inline struct counters *counters_ptr(void)
{
    u32 zero = 0;
    return counters.lookup(&zero);
}

#define COUNT(field)                                    \
    do {                                                \
        struct counters *c_ = counters_ptr();           \
        if (c_)                                         \
            __sync_fetch_and_add(&c_->field, 1);        \
    } while (0)

// The current task's tgid if it is tracked, else 0.
static __always_inline u32 tracked_tgid(u64 id)
{
    u32 tgid = id >> 32;
    if (!tracked.lookup(&tgid))
        return 0;
    return tgid;
}

static __always_inline void emit(struct record *r)
{
    struct record *e = events.ringbuf_reserve(sizeof(struct record));
    if (!e) {
        COUNT(reserve_failed);
        return;
    }
    __builtin_memcpy(e, r, sizeof(*r));
    // The reader polls on a timer and drains in batches: no wakeup per record.
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}
// <<< shared preamble

// -- end of the shared pieces --

#ifndef GAP_NS
#define GAP_NS 5000000
#endif

BPF_HASH(aggs, u32, struct fault_agg, MAX_TIDS);  // tid -> faults since start_ns
BPF_ARRAY(calib, u64, 2);                     // [0] = tid to count, [1] = its faults

// The thread's latest fault, still open, ends now: measured when its on-CPU
// time is at most GAP_NS.
static __always_inline void close_fault(struct fault_agg *a, u64 now)
{
    if (!a->open)
        return;
    u64 d = a->open_ns;
    if (a->seg_ns && now > a->seg_ns)
        d += now - a->seg_ns;
    if (d <= GAP_NS) {
        a->measured += 1;
        a->measured_ns += d;
    }
    a->open = 0;
    a->open_ns = 0;
    a->seg_ns = 0;
}

TRACEPOINT_PROBE(exceptions, page_fault_user)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = id;
    u32 pid = tracked_tgid(id);
    if (!pid) {
        u32 k = 0;
        u64 *ctid = calib.lookup(&k);
        if (ctid && *ctid && *ctid == tid) {
            k = 1;
            u64 *n = calib.lookup(&k);
            if (n)
                __sync_fetch_and_add(n, 1);
        }
        return KEEP_PERF_EVENT;
    }
    u64 now = bpf_ktime_get_ns();
    struct fault_agg *a = aggs.lookup(&tid);
    if (a) {
        close_fault(a, now);  // the previous fault's time goes with its own row
        if (now - a->start_ns >= FLUSH_NS) {
            struct record r = {};
            r.start_ns = a->start_ns;
            r.end_ns = a->last_ns;
            r.measured_ns = a->measured_ns;
            r.pid = a->pid;
            r.tid = tid;
            r.count = a->count;
            r.measured = a->measured;
            emit(&r);
            a->start_ns = now;
            a->count = 0;
            a->measured = 0;
            a->measured_ns = 0;
        }
        a->count += 1;
        a->last_ns = now;
        a->open = 1;
        a->seg_ns = now;
        return KEEP_PERF_EVENT;
    }
    struct fault_agg init = {};
    init.start_ns = now;
    init.last_ns = now;
    init.count = 1;
    init.pid = pid;
    init.open = 1;
    init.seg_ns = now;
    if (aggs.update(&tid, &init))
        COUNT(aggs_full);
    return KEEP_PERF_EVENT;
}

// The clock of an open fault runs only while its thread is on CPU. Only
// threads with an aggregate (a fault in the last FLUSH_NS or so) are found:
// one hash lookup per switch-out and switch-in on the host.
TRACEPOINT_PROBE(sched, sched_switch)
{
    u32 prev = args->prev_pid;
    u32 next = args->next_pid;
    u64 now = 0;
    struct fault_agg *a = prev ? aggs.lookup(&prev) : 0;
    if (a && a->open) {
        now = bpf_ktime_get_ns();
        if (a->seg_ns && now > a->seg_ns)
            a->open_ns += now - a->seg_ns;
        a->seg_ns = 0;
        // prev_state is the report state, one-hot (S=0x1, D=0x2, ...); 0, or
        // 0x100 with the low byte 0, for a preemption (see sched_bcc.c). A
        // fault sleeps only uninterruptibly (I/O, a lock): any other sleep
        // means the thread had left the fault for a system call, so its time
        // is not measured.
        long st = args->prev_state & 0xff;
        if ((st != 0 && st != 0x2) || a->open_ns > GAP_NS) {
            a->open = 0;
            a->open_ns = 0;
        }
    }
    a = next ? aggs.lookup(&next) : 0;
    if (a && a->open) {
        if (!now)
            now = bpf_ktime_get_ns();
        a->seg_ns = now;
    }
    return KEEP_PERF_EVENT;
}
