// User page faults of tracked threads, counted per thread in the kernel.
//
// exceptions:page_fault_user runs in the faulting task's context, on entry
// only (no end event), so a fault has a time but no duration here. Faults of
// one thread are summed into one aggregate; when a fault comes more than
// FLUSH_NS after the aggregate's first one, the aggregate is written to the
// ring as one record and a new one starts. User space flushes aggregates
// that went idle. CALIB_TID (set by user space) counts the faults of one
// thread of the daemon while it calibrates the cost of a fault.

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

BPF_HASH(aggs, u32, struct agg, MAX_TIDS);    // tid -> faults since start_ns
BPF_ARRAY(calib, u64, 2);                     // [0] = tid to count, [1] = its faults

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
    struct agg *a = aggs.lookup(&tid);
    if (a) {
        if (now - a->start_ns >= FLUSH_NS) {
            struct record r = {};
            r.start_ns = a->start_ns;
            r.end_ns = a->last_ns;
            r.pid = a->pid;
            r.tid = tid;
            r.count = a->count;
            emit(&r);
            a->start_ns = now;
            a->count = 0;
        }
        a->count += 1;
        a->last_ns = now;
        return KEEP_PERF_EVENT;
    }
    struct agg init = {};
    init.start_ns = now;
    init.last_ns = now;
    init.count = 1;
    init.pid = pid;
    if (aggs.update(&tid, &init))
        COUNT(aggs_full);
    return KEEP_PERF_EVENT;
}
