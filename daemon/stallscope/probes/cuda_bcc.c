// Host time of tracked processes inside the CUDA driver (libcuda.so):
// launches, synchronisations, polling loops and copies.
//
// User space attaches these functions as uprobes (entry) and uretprobes
// (return) on libcuda's exported entry points, per traced process only, so
// an untraced process never enters this program. The entry keeps (time,
// entry point, kind) per thread; a probed call made inside another only
// deepens it (the outer one is timed). The return writes a call of at least
// THRESHOLD_NS as one record and adds a shorter one to the (thread, kind)
// aggregate, which the kernel writes out once it spans FLUSH_NS, or when the
// thread turns from launching and copying to waiting (a sync or a query) or
// back: so a summed row is one burst (a step's launches, up to its sync) and
// a step's share of it is not smeared over its neighbours; user space
// flushes idle ones. Queries (cuEventQuery, cuStreamQuery) are the
// steps of a polling loop: from the first one answering CU_NOT_READY to the
// one that answers otherwise is one CU_KIND_POLL call, time between the
// queries included (the host spun waiting); a gap of more than POLL_GAP_NS
// between two queries ends the loop at the last one.

#include "cuda_bcc.h"
#include "kcause_common.h"

#ifndef THRESHOLD_NS
#define THRESHOLD_NS 50000
#endif
#ifndef FLUSH_NS
#define FLUSH_NS 20000000
#endif
#ifndef POLL_GAP_NS
#define POLL_GAP_NS 10000000
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

BPF_HASH(inflight, u32, struct cu_call, MAX_TIDS);    // tid -> call in flight
BPF_HASH(polls, u32, struct cu_poll, MAX_TIDS);       // tid -> polling loop
BPF_HASH(aggs, struct cu_key, struct cu_agg, MAX_AGGS);  // (tid, kind) -> short calls
BPF_HASH(phase, u32, u32, MAX_TIDS);                  // tid -> 1 waiting (sync, query), 0 not

static __always_inline void add_call(u32 pid, u32 tid, u32 kind, u64 ip, u64 start, u64 now,
                                     u32 calls)
{
    u64 took = now - start;
    if (took >= THRESHOLD_NS) {
        struct record r = {};
        r.start_ns = start;
        r.end_ns = now;
        r.total_ns = took;
        r.ip = ip;
        r.pid = pid;
        r.tid = tid;
        r.kind = kind;
        r.count = 1;
        r.calls = calls;
        emit(&r);
        return;
    }
    struct cu_key k = {};
    k.tid = tid;
    k.kind = kind;
    struct cu_agg *a = aggs.lookup(&k);
    if (a) {
        if (now - a->start_ns >= FLUSH_NS) {
            struct record r = {};
            r.start_ns = a->start_ns;
            r.end_ns = a->last_ns;
            r.total_ns = a->total_ns;
            r.pid = a->pid;
            r.tid = tid;
            r.kind = kind;
            r.count = a->count;
            r.calls = a->calls;
            emit(&r);
            a->start_ns = start;
            a->count = 0;
            a->calls = 0;
            a->total_ns = 0;
        }
        a->count += 1;
        a->calls += calls;
        a->total_ns += took;
        a->last_ns = now;
        return;
    }
    struct cu_agg init = {};
    init.start_ns = start;
    init.last_ns = now;
    init.total_ns = took;
    init.count = 1;
    init.calls = calls;
    init.pid = pid;
    if (aggs.update(&k, &init))
        COUNT(aggs_full);
}

// Write out the thread's aggregate of `kind`, if any.
static __always_inline void close_agg(u32 tid, u32 kind)
{
    struct cu_key k = {};
    k.tid = tid;
    k.kind = kind;
    struct cu_agg *a = aggs.lookup(&k);
    if (!a)
        return;
    struct record r = {};
    r.start_ns = a->start_ns;
    r.end_ns = a->last_ns;
    r.total_ns = a->total_ns;
    r.pid = a->pid;
    r.tid = tid;
    r.kind = kind;
    r.count = a->count;
    r.calls = a->calls;
    emit(&r);
    aggs.delete(&k);
}

static __always_inline int enter(struct pt_regs *ctx, u32 kind)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 pid = tracked_tgid(id);
    if (!pid)
        return 0;
    u32 tid = id;
    u32 waiting = kind == CU_KIND_SYNC || kind == CU_KIND_POLL;
    u32 *was = phase.lookup(&tid);
    if (!was || *was != waiting) {
        // the other phase's bursts are over
        if (waiting) {
            close_agg(tid, CU_KIND_LAUNCH);
            close_agg(tid, CU_KIND_COPY);
        } else {
            close_agg(tid, CU_KIND_SYNC);
            close_agg(tid, CU_KIND_POLL);
        }
        phase.update(&tid, &waiting);
    }
    struct cu_call *c = inflight.lookup(&tid);
    if (c) {
        c->depth += 1;
        return 0;
    }
    struct cu_call n = {};
    n.start_ns = bpf_ktime_get_ns();
    n.ip = PT_REGS_IP(ctx);
    n.pid = pid;
    n.kind = kind;
    n.depth = 1;
    if (inflight.update(&tid, &n))
        COUNT(inflight_full);
    return 0;
}

int on_launch(struct pt_regs *ctx) { return enter(ctx, CU_KIND_LAUNCH); }
int on_sync(struct pt_regs *ctx) { return enter(ctx, CU_KIND_SYNC); }
int on_query(struct pt_regs *ctx) { return enter(ctx, CU_KIND_POLL); }
int on_copy(struct pt_regs *ctx) { return enter(ctx, CU_KIND_COPY); }

// A query returned `rc` at `now`: continue, end or start the thread's loop.
static __always_inline void query_done(u32 pid, u32 tid, u64 ip, u64 start, u64 now, int rc)
{
    struct cu_poll *p = polls.lookup(&tid);
    if (p && start - p->last_ns > POLL_GAP_NS) {
        // the loop was left: it ended at its last query
        add_call(p->pid, tid, CU_KIND_POLL, p->ip, p->start_ns, p->last_ns, p->queries);
        polls.delete(&tid);
        p = 0;
    }
    if (rc == CU_NOT_READY) {
        if (p) {
            p->last_ns = now;
            p->queries += 1;
            return;
        }
        struct cu_poll n = {};
        n.start_ns = start;
        n.last_ns = now;
        n.ip = ip;
        n.pid = pid;
        n.queries = 1;
        if (polls.update(&tid, &n))
            COUNT(inflight_full);
        return;
    }
    if (p) {
        add_call(p->pid, tid, CU_KIND_POLL, p->ip, p->start_ns, now, p->queries + 1);
        polls.delete(&tid);
        return;
    }
    add_call(pid, tid, CU_KIND_POLL, ip, start, now, 1);  // done at the first query
}

int on_return(struct pt_regs *ctx)
{
    u32 tid = bpf_get_current_pid_tgid();
    struct cu_call *c = inflight.lookup(&tid);
    if (!c)
        return 0;
    if (c->depth > 1) {
        c->depth -= 1;
        return 0;
    }
    u64 now = bpf_ktime_get_ns();
    u64 start = c->start_ns;
    u64 ip = c->ip;
    u32 pid = c->pid;
    u32 kind = c->kind;
    inflight.delete(&tid);
    if (kind == CU_KIND_POLL) {
        query_done(pid, tid, ip, start, now, (int)PT_REGS_RC(ctx));
        return 0;
    }
    add_call(pid, tid, kind, ip, start, now, 1);
    return 0;
}
