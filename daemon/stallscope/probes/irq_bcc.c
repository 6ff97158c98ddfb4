// Hard and soft IRQ time taken from tracked threads while they were on a CPU.
//
// irq:irq_handler_entry/exit (device interrupt handlers) and
// irq:softirq_entry/exit (softirq vectors, also when run at the end of a
// hard IRQ or on local_bh_enable in the task's own context) run with the
// interrupted task as current: when its tgid is tracked, the entry time is
// kept per CPU and kind, and the exit writes one record. A hard IRQ can
// interrupt a softirq, hence two slots per CPU. Interrupts that have no
// such tracepoint (the local APIC timer, IPIs) are not seen.

#include "irq_bcc.h"
#include "kcause_common.h"

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

BPF_PERCPU_ARRAY(pending, struct pending, 2);   // [IRQ_KIND_HARD], [IRQ_KIND_SOFT]

static __always_inline void enter(u32 kind, u32 vec)
{
    u64 id = bpf_get_current_pid_tgid();
    struct pending *p = pending.lookup(&kind);
    if (!p)
        return;
    u32 pid = tracked_tgid(id);
    if (!pid) {
        p->active = 0;
        return;
    }
    p->start_ns = bpf_ktime_get_ns();
    p->pid = pid;
    p->tid = id;
    p->vec = vec;
    p->active = 1;
}

static __always_inline void leave(u32 kind)
{
    struct pending *p = pending.lookup(&kind);
    if (!p || !p->active)
        return;
    p->active = 0;
    struct record r = {};
    r.start_ns = p->start_ns;
    r.end_ns = bpf_ktime_get_ns();
    r.pid = p->pid;
    r.tid = p->tid;
    r.vec = p->vec;
    r.cpu = bpf_get_smp_processor_id();
    r.kind = kind;
    emit(&r);
}

TRACEPOINT_PROBE(irq, irq_handler_entry)
{
    enter(IRQ_KIND_HARD, args->irq);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(irq, irq_handler_exit)
{
    leave(IRQ_KIND_HARD);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(irq, softirq_entry)
{
    enter(IRQ_KIND_SOFT, args->vec);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(irq, softirq_exit)
{
    leave(IRQ_KIND_SOFT);
    return KEEP_PERF_EVENT;
}
