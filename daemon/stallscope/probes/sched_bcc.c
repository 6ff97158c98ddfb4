// Scheduling events of tracked processes, paired in the kernel.
//
// Loaded by sched_bcc.py with settings as cflags (MAX_TIDS, MAX_TGIDS,
// RINGBUF_PAGES). Reads ONLY tracepoint fields (bcc builds `args` from the
// live tracefs format) and BPF helpers: never a task_struct field, because
// the kernel headers bcc compiles against may not match the running kernel
// and such reads return garbage silently.
//
// One 40-byte record per switch-in of a tracked thread (carrying both the
// off-CPU interval and the run-queue wait it ends) and one per real
// migration. Pairing here, keyed by tid, halves the record rate compared to
// emitting every switch and wakeup and leaves user space a pure decode.

#include <uapi/linux/ptrace.h>

#ifndef MAX_TIDS
#define MAX_TIDS 65536
#endif
#ifndef MAX_TGIDS
#define MAX_TGIDS 4096
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 1024
#endif

#define STALL_CLONE_THREAD 0x00010000ULL

// A tracepoint program's return value decides whether the kernel still
// hands the event to perf users on this host (0 discards it for everyone:
// `perf record -e sched:*` or our own perf backend would go silent while
// this probe runs). We only observe, so we always pass events on.
#define KEEP_PERF_EVENT 1

#define KIND_SWITCH_IN 1
#define KIND_MIGRATE 2

#define CNT_RESERVE_FAILED 0
#define CNT_STATE_FULL 1
#define CNT_LOST_IN_PREEMPTED 2   // switch-in never seen: preempted interval lost
#define CNT_LOST_IN_VOLUNTARY 3   // same, for an interval after a voluntary switch

// Layout mirrored by RECORD_DTYPE in sched_bcc.py.
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
    u16 pad;
};

// Per tracked thread: the pending switch-out and run-queue entry.
struct tstate {
    u64 off_ns;
    u64 rq_ns;
    u32 pid;
    u16 cpu;
    u8 preempted;
    u8 pad;
    // switch-outs seen, for user space to compare with the kernel's own
    // nvcsw/nivcsw (/proc status): a tracepoint run the kernel drops
    // without counting it as a BPF miss shows up as a difference
    u32 n_vol;
    u32 n_inv;
};

BPF_HASH(tracked, u32, u8, MAX_TGIDS);        // tgids to follow (user space)
BPF_HASH(tid_tgid, u32, u32, MAX_TIDS);       // threads of tracked tgids
BPF_HASH(state, u32, struct tstate, MAX_TIDS);
// Mmapped by user space, which reads it without a bpf() syscall: map
// syscalls raise the CPU's bpf_prog_active for their duration, and a
// tracepoint program that fires on that CPU meanwhile is skipped.
BPF_F_TABLE("array", u32, u64, counters, 8, BPF_F_MMAPABLE);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

static __always_inline void count(u32 idx)
{
    counters.atomic_increment(idx);
}

static __always_inline void emit(struct record *r)
{
    struct record *e = events.ringbuf_reserve(sizeof(struct record));
    if (!e) {
        count(CNT_RESERVE_FAILED);
        return;
    }
    __builtin_memcpy(e, r, sizeof(*r));
    // The reader polls on a timer and drains in batches; waking it per
    // record would add a context switch per event to the host.
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

// A thread of a tracked process became runnable: start its run-queue wait.
static __always_inline void runnable(u32 tid)
{
    u32 *tgid = tid_tgid.lookup(&tid);
    if (!tgid)
        return;
    if (!tracked.lookup(tgid))
        return;
    u64 now = bpf_ktime_get_ns();
    struct tstate *s = state.lookup(&tid);
    if (s) {
        s->rq_ns = now;
        return;
    }
    struct tstate init = {};
    init.rq_ns = now;
    init.pid = *tgid;
    if (state.update(&tid, &init))
        count(CNT_STATE_FULL);
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    // The clock and CPU are read only once a tracked thread is involved:
    // almost every switch on a host is not ours and should cost two lookups.
    u64 now = 0;
    u16 cpu = 0;
    // At sched_switch the current task is still prev, so this is prev's tgid.
    u32 prev_tgid = bpf_get_current_pid_tgid() >> 32;
    u32 prev_tid = args->prev_pid;

    // Exiting threads (X or Z in prev_state) switch out one last time after
    // sched_process_exit: forget them instead of keeping a stale entry.
    if (prev_tid != 0 && (args->prev_state & 0x30)) {
        state.delete(&prev_tid);
        tid_tgid.delete(&prev_tid);
    } else if (prev_tid != 0 && tracked.lookup(&prev_tgid)) {
        // prev_state is the task's report state, one-hot (S=0x1, D=0x2, ...,
        // I=0x80); 0 means still runnable, i.e. the task was taken off the CPU
        // (tick or wakeup preemption, sched_yield) rather than going to sleep.
        // A preemption reports 0x100 (TASK_REPORT_MAX) whatever the state the
        // task had set, because a preempted task is never dequeued: masking
        // it off counts it as preempted. This is exactly the kernel's split
        // into nivcsw / nvcsw (nonvoluntary / voluntary_ctxt_switches).
        u8 preempted = (args->prev_state & 0xff) == 0;
        now = bpf_ktime_get_ns();
        cpu = bpf_get_smp_processor_id();
        struct tstate *s = state.lookup(&prev_tid);
        if (s) {
            // A switch-out while the last one is still unpaired means the
            // kernel dropped a run of this program at the switch-in (seen
            // under concurrent tracing, not counted as a BPF miss): the
            // pending interval is lost; count it by kind.
            if (s->off_ns)
                count(s->preempted ? CNT_LOST_IN_PREEMPTED : CNT_LOST_IN_VOLUNTARY);
            s->off_ns = now;
            s->cpu = cpu;
            s->preempted = preempted;
            s->pid = prev_tgid;
            s->rq_ns = preempted ? now : 0;
            if (preempted)
                s->n_inv++;
            else
                s->n_vol++;
        } else {
            struct tstate init = {};
            init.off_ns = now;
            init.cpu = cpu;
            init.preempted = preempted;
            init.pid = prev_tgid;
            init.rq_ns = preempted ? now : 0;
            init.n_inv = preempted;
            init.n_vol = !preempted;
            if (state.update(&prev_tid, &init))
                count(CNT_STATE_FULL);
            // A thread we first meet here (a race with track()'s /proc scan)
            // must also be known to the wakeup and migration probes.
            tid_tgid.update(&prev_tid, &prev_tgid);
        }
    }

    u32 next_tid = args->next_pid;
    struct tstate *n = state.lookup(&next_tid);
    if (!n)
        return KEEP_PERF_EVENT;
    if (!n->off_ns && !n->rq_ns)
        return KEEP_PERF_EVENT;
    u32 pid = n->pid;
    if (!tracked.lookup(&pid)) {
        // untracked since: forget it
        state.delete(&next_tid);
        return KEEP_PERF_EVENT;
    }
    if (!now) {
        now = bpf_ktime_get_ns();
        cpu = bpf_get_smp_processor_id();
    }
    struct record r = {};
    r.a_ns = n->off_ns;
    r.b_ns = n->rq_ns;
    r.c_ns = now;
    r.pid = pid;
    r.tid = next_tid;
    r.cpu_a = n->cpu;
    r.cpu_b = cpu;
    r.kind = KIND_SWITCH_IN;
    r.preempted = n->preempted;
    n->off_ns = 0;
    n->rq_ns = 0;
    emit(&r);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    runnable(args->pid);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    runnable(args->pid);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(sched, sched_migrate_task)
{
    // Also fires when the CPU does not change; only a real change counts
    // (as se.nr_migrations does in set_task_cpu()).
    if (args->orig_cpu == args->dest_cpu)
        return KEEP_PERF_EVENT;
    u32 tid = args->pid;
    u32 *tgid = tid_tgid.lookup(&tid);
    if (!tgid)
        return KEEP_PERF_EVENT;
    u32 pid = *tgid;
    if (!tracked.lookup(&pid))
        return KEEP_PERF_EVENT;
    struct record r = {};
    r.a_ns = bpf_ktime_get_ns();
    r.pid = pid;
    r.tid = tid;
    r.cpu_a = args->orig_cpu;
    r.cpu_b = args->dest_cpu;
    r.kind = KIND_MIGRATE;
    emit(&r);
    return KEEP_PERF_EVENT;
}

// New threads of a tracked process. task_newtask runs in the creator's
// context and carries clone_flags, which sched_process_fork lacks: with
// CLONE_THREAD the child joins the creator's tgid, without it the child is a
// new process (its tgid is its own pid), which we do not follow.
TRACEPOINT_PROBE(task, task_newtask)
{
    if (!(args->clone_flags & STALL_CLONE_THREAD))
        return KEEP_PERF_EVENT;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!tracked.lookup(&tgid))
        return KEEP_PERF_EVENT;
    u32 tid = args->pid;
    tid_tgid.update(&tid, &tgid);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 tid = args->pid;
    tid_tgid.delete(&tid);
    state.delete(&tid);
    return KEEP_PERF_EVENT;
}
