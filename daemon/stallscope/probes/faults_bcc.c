// User page faults of tracked threads, and the time each took, per thread in
// the kernel.
//
// exceptions:page_fault_user runs in the faulting task's context, on entry
// only (no end event on this kernel; fexit on the fault handler would give
// the end exactly but BPF trampolines are refused here). So a fault's time
// is measured in the thread that took it, as its on-CPU time from the entry
// to the fault's end, which is found one of two ways:
//
// - at the page's mapping (MAP_END): a fault that maps a page changes the
//   process's RSS counter just before it sets the page table entry (kmem:
//   rss_stat, in the faulting task, after the page was zeroed or copied).
//   The first rss_stat of the thread after the entry whose user registers
//   are still the fault's (same instruction address, orig_ax -1: an
//   exception, not a system call such as munmap) is the fault's end; the
//   return to user mode after it adds at most TAIL_NS. This is what makes
//   a 5 ms huge-page fault (direct compaction) and a sparse fault followed
//   by long user work measurable: neither has a next fault close by.
// - at the thread's next fault, when that is at most GAP_NS of on-CPU time
//   away and no mapping was seen (a fault that maps nothing: write-protect
//   reuse, NUMA hinting, one another thread resolved): in a burst of first
//   touches that is the fault and the few instructions that lead to the
//   next one.
//
// The clock pauses while the thread is off CPU (sched_switch out, preempted
// or in uninterruptible sleep, e.g. a fault waiting for I/O) and resumes
// when it runs again. A fault whose end was not found this way (no mapping,
// and it ran past GAP_NS or ended in an interruptible sleep: the thread had
// left the fault and made a system call) is counted but not measured: user
// space prices it at the mean of the measured ones (faults_bcc.py). An open
// fault that has not mapped its page after FAULT_MAX_NS of CPU is given up.
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
#ifndef TAIL_NS
#define TAIL_NS 5000
#endif
#ifndef FAULT_MAX_NS
#define FAULT_MAX_NS 200000000
#endif

BPF_HASH(aggs, u32, struct fault_agg, MAX_TIDS);  // tid -> faults since start_ns
BPF_ARRAY(calib, u64, 2);                     // [0] = tid to count, [1] = its faults

// The on-CPU time of the open fault until `now` (0: the thread is off CPU).
static __always_inline u64 open_time(struct fault_agg *a, u64 now)
{
    u64 d = a->open_ns;
    if (a->seg_ns && now > a->seg_ns)
        d += now - a->seg_ns;
    return d;
}

// The thread's latest fault, still open, ends now. `next`: it ends at the
// thread's next fault (its time may run to it); else it ends because the
// thread left it (a system call's sleep, the aggregate's flush, a fault that
// ran too long): only a fault that mapped its page is measured then.
static __always_inline void close_fault(struct fault_agg *a, u64 now, int next)
{
    if (!a->open)
        return;
    u64 d = open_time(a, now);
    if (a->map_ns) {
        u64 t = a->map_ns + TAIL_NS;
        a->measured += 1;
        a->measured_ns += d < t ? d : t;
        COUNT(ended_at_map);
    } else if (next && d <= GAP_NS) {
        a->measured += 1;
        a->measured_ns += d;
        COUNT(ended_at_next);
    }
    a->open = 0;
    a->open_ns = 0;
    a->seg_ns = 0;
    a->map_ns = 0;
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
        close_fault(a, now, 1);  // the previous fault's time goes with its own row
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
        a->ip = args->ip;
        return KEEP_PERF_EVENT;
    }
    struct fault_agg init = {};
    init.start_ns = now;
    init.last_ns = now;
    init.count = 1;
    init.pid = pid;
    init.open = 1;
    init.seg_ns = now;
    init.ip = args->ip;
    if (aggs.update(&tid, &init))
        COUNT(aggs_full);
    return KEEP_PERF_EVENT;
}

#if MAP_END
// The open fault mapped its page: the RSS counter of the current mm changes
// in the faulting task just before the page table entry is set. Most calls
// (every RSS change on the host) end at the first lookup: no open fault.
TRACEPOINT_PROBE(kmem, rss_stat)
{
    if (!args->curr)
        return KEEP_PERF_EVENT;
    u32 tid = bpf_get_current_pid_tgid();
    struct fault_agg *a = aggs.lookup(&tid);
    if (!a || !a->open || a->map_ns)
        return KEEP_PERF_EVENT;
    // Still inside that fault: the user registers are the fault's (a system
    // call, munmap say, has orig_ax >= 0 and the instruction after it).
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    u64 ip = 0;
    long orig_ax = 0;
    bpf_probe_read_kernel(&ip, sizeof(ip), &regs->ip);
    bpf_probe_read_kernel(&orig_ax, sizeof(orig_ax), &regs->orig_ax);
    if (ip != a->ip || orig_ax != -1)
        return KEEP_PERF_EVENT;
    u64 d = open_time(a, bpf_ktime_get_ns());
    a->map_ns = d ? d : 1;
    return KEEP_PERF_EVENT;
}
#endif

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
        // means the thread had left the fault for a system call. Past the
        // gap bound a fault is measured only at its mapping: one that has
        // mapped is done, one that has not is waited for up to FAULT_MAX_NS.
        long st = args->prev_state & 0xff;
        if ((st != 0 && st != 0x2) || (a->open_ns > GAP_NS && a->map_ns) ||
            a->open_ns > FAULT_MAX_NS)
            close_fault(a, now, 0);
    }
    a = next ? aggs.lookup(&next) : 0;
    if (a && a->open) {
        if (!now)
            now = bpf_ktime_get_ns();
        a->seg_ns = now;
    }
    return KEEP_PERF_EVENT;
}
