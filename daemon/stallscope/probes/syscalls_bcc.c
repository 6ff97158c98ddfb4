// System calls of tracked threads: long ones exactly, short ones summed.
//
// raw_syscalls:sys_enter/sys_exit fire for every syscall on the host, and
// attaching them at all moves every syscall onto the kernel's slow path, so
// user space attaches this program only while it is wanted (the daemon's
// deep mode or a diagnosis window). The enter filters on the tracked tgid
// and keeps (entry time, nr) per thread; the exit writes a call of at least
// THRESHOLD_NS as one record and adds a shorter one to the (thread, nr)
// aggregate, which the kernel writes out once it spans FLUSH_NS and user
// space flushes once idle.

#include "syscalls_bcc.h"
#include "kcause_common.h"

#ifndef THRESHOLD_NS
#define THRESHOLD_NS 50000
#endif
#ifndef FLUSH_NS
#define FLUSH_NS 20000000
#endif
#ifndef MAX_TIDS
#define MAX_TIDS 16384
#endif
#ifndef MAX_AGGS
#define MAX_AGGS 16384
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

BPF_HASH(inflight, u32, struct sc_enter, MAX_TIDS);   // tid -> call in flight
BPF_HASH(aggs, struct sc_key, struct agg, MAX_AGGS);  // (tid, nr) -> short calls

TRACEPOINT_PROBE(raw_syscalls, sys_enter)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 pid = tracked_tgid(id);
    if (!pid)
        return KEEP_PERF_EVENT;
    u32 tid = id;
    struct sc_enter e = {};
    e.start_ns = bpf_ktime_get_ns();
    e.nr = args->id;
    e.pid = pid;
    if (inflight.update(&tid, &e))
        COUNT(inflight_full);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(raw_syscalls, sys_exit)
{
    u32 tid = bpf_get_current_pid_tgid();
    struct sc_enter *e = inflight.lookup(&tid);
    if (!e)
        return KEEP_PERF_EVENT;
    u64 now = bpf_ktime_get_ns();
    u64 start = e->start_ns;
    u32 nr = e->nr;
    u32 pid = e->pid;
    inflight.delete(&tid);
    u64 took = now - start;
    if (took >= THRESHOLD_NS) {
        struct record r = {};
        r.start_ns = start;
        r.end_ns = now;
        r.total_ns = took;
        r.pid = pid;
        r.tid = tid;
        r.nr = nr;
        r.count = 1;
        emit(&r);
        return KEEP_PERF_EVENT;
    }
    struct sc_key k = {};
    k.tid = tid;
    k.nr = nr;
    struct agg *a = aggs.lookup(&k);
    if (a) {
        if (now - a->start_ns >= FLUSH_NS) {
            struct record r = {};
            r.start_ns = a->start_ns;
            r.end_ns = a->last_ns;
            r.total_ns = a->total_ns;
            r.pid = a->pid;
            r.tid = tid;
            r.nr = nr;
            r.count = a->count;
            emit(&r);
            a->start_ns = start;
            a->count = 0;
            a->total_ns = 0;
        }
        a->count += 1;
        a->total_ns += took;
        a->last_ns = now;
        return KEEP_PERF_EVENT;
    }
    struct agg init = {};
    init.start_ns = start;
    init.last_ns = now;
    init.total_ns = took;
    init.count = 1;
    init.pid = pid;
    if (aggs.update(&k, &init))
        COUNT(aggs_full);
    return KEEP_PERF_EVENT;
}
