// CPython's USDT probes gc__start(int generation) / gc__done(long collected),
// paired per thread in the kernel: one record per collection of the process
// these programs are attached to (bcc's USDT context carries the pid). The
// layout of `struct gc_record` is gc_usdt.py's RECORD (one source each side:
// keep them equal). Times are bpf_ktime_get_ns(): CLOCK_MONOTONIC.
#include <uapi/linux/ptrace.h>

struct gc_start {
    u64 start_ns;
    s32 generation;
};

struct gc_record {
    u64 start_ns;
    u64 end_ns;
    s64 collected;
    u32 tid;
    s32 generation;
};

BPF_HASH(starts, u32, struct gc_start, MAX_THREADS);
BPF_RINGBUF_OUTPUT(records, RING_PAGES);
BPF_ARRAY(lost, u64, 1);

int on_gc_start(struct pt_regs *ctx) {
    struct gc_start s = {};
    s.start_ns = bpf_ktime_get_ns();
    bpf_usdt_readarg(1, ctx, &s.generation);
    u32 tid = (u32)bpf_get_current_pid_tgid();
    starts.update(&tid, &s);
    return 0;
}

int on_gc_done(struct pt_regs *ctx) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct gc_start *s = starts.lookup(&tid);
    if (!s)
        return 0;  // the pass began before we were attached
    struct gc_record *r = records.ringbuf_reserve(sizeof(struct gc_record));
    if (!r) {
        int zero = 0;
        u64 *n = lost.lookup(&zero);
        if (n)
            __sync_fetch_and_add(n, 1);
        starts.delete(&tid);
        return 0;
    }
    r->start_ns = s->start_ns;
    r->end_ns = bpf_ktime_get_ns();
    long collected = 0;
    bpf_usdt_readarg(1, ctx, &collected);
    r->collected = collected;
    r->tid = tid;
    r->generation = s->generation;
    records.ringbuf_submit(r, 0);
    starts.delete(&tid);
    return 0;
}
