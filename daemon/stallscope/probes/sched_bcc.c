// Scheduling events of tracked processes, paired in the kernel.
//
// Loaded by sched_bcc.py with settings as cflags (MAX_TIDS, MAX_TGIDS,
// RINGBUF_PAGES); record and counter layouts live in sched_bcc.h. Reads ONLY
// tracepoint fields (bcc builds `args` from the live tracefs format) and BPF
// helpers: never a task_struct field, because the kernel headers bcc
// compiles against may not match the running kernel and such reads return
// garbage silently.
//
// One record per switch-in of a tracked thread (carrying the off-CPU
// interval, the run-queue wait it ends, and who: the task that preempted it
// or the thread that woke it) and one per real migration. Pairing here,
// keyed by tid, halves the record rate compared to emitting every switch and
// wakeup and leaves user space a pure decode. Threads user space put in
// `summarised` (workers that never run a step) get no records at all: their
// totals are added to their slot of the mmapped `summaries` array instead.
// Their tids stay in `tid_tgid`, so a step thread's preemptor or waker
// among them is still named with its tgid.

#include <uapi/linux/ptrace.h>
#include "sched_bcc.h"

#ifndef MAX_TIDS
#define MAX_TIDS 65536
#endif
#ifndef MAX_TGIDS
#define MAX_TGIDS 4096
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 1024
#endif
#ifndef MAX_SUMMARY
#define MAX_SUMMARY 1024
#endif

#define STALL_CLONE_THREAD 0x00010000ULL

// A tracepoint program's return value decides whether the kernel still
// hands the event to perf users on this host (0 discards it for everyone:
// `perf record -e sched:*` or our own perf backend would go silent while
// this probe runs). We only observe, so we always pass events on.
#define KEEP_PERF_EVENT 1

// Per tracked thread: the pending switch-out and run-queue entry.
struct tstate {
    u64 off_ns;
    u64 rq_ns;
    u32 pid;
    u16 cpu;
    u8 preempted;
    u8 other_irq;    // woken from interrupt context
    u8 yielded;      // the preempted switch-out was inside sched_yield()
    // switch-outs seen, for user space to compare with the kernel's own
    // nvcsw/nivcsw (/proc status): a tracepoint run the kernel drops
    // without counting it as a BPF miss shows up as a difference
    u32 n_vol;
    u32 n_inv;
    // who: the preemptor (set at the switch-out) or the waker (sched_waking)
    u32 other_tid;
    u32 other_pid;
    char other_comm[COMM_LEN];
};

BPF_HASH(tracked, u32, u8, MAX_TGIDS);        // tgids to follow (user space)
BPF_HASH(tid_tgid, u32, u32, MAX_TIDS);       // threads of tracked tgids
BPF_HASH(state, u32, struct tstate, MAX_TIDS);
// Mmapped by user space, which reads it without a bpf() syscall: map
// syscalls raise the CPU's bpf_prog_active for their duration, and a
// tracepoint program that fires on that CPU meanwhile is skipped.
BPF_F_TABLE("array", u32, struct counters, counters, 1, BPF_F_MMAPABLE);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
// Threads summarised instead of reported event by event (pool workers that
// never emit a span: user space decides), tid -> slot of `summaries`.
BPF_HASH(summarised, u32, u32, MAX_SUMMARY);
BPF_F_TABLE("array", u32, struct summary, summaries, MAX_SUMMARY, BPF_F_MMAPABLE);
// The gap clock (stallscope/gaps.py): the daemon's periodic work waits for
// a moment a tracked thread leaves its CPU idle, instead of waking on a
// timer while the engine runs (a thread woken beside a busy engine takes
// its CPU at the engine's next slice end, whatever its priority: EEVDF,
// BENCHMARKS.md). User space writes, through the mmapped `gap_due`, the
// earliest monotonic time a waiter wants its gap; the first such idle
// switch at or after it writes one record to `gap_kicks` with a wake-up,
// and sets the time to never until user space asks again. One kick per
// request, so the rate of wake-ups is the waiters', not the engine's.
BPF_F_TABLE("array", u32, u64, gap_due, 1, BPF_F_MMAPABLE);
BPF_RINGBUF_OUTPUT(gap_kicks, 1);
// Never written: its value type tells user space the compiled record layout.
BPF_ARRAY(layout_record, struct record, 1);
// Per CPU: when the task now running there was switched in. Written at
// every switch on the host (one clock read and one per-CPU store: the only
// work an untracked switch does besides its two lookups), so that a tracked
// thread's switch-in can say how long the task it replaces had run.
BPF_PERCPU_ARRAY(cpu_switch_ns, u64, 1);
// Per CPU: how deep in interrupt context (hard IRQ, softirq, hrtimer
// callback) the CPU is, so a wakeup there is not blamed on the task it
// interrupted. Tracepoints give no in_interrupt(); entry/exit pairs do.
BPF_PERCPU_ARRAY(irq_depth, u32, 1);

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

// The summary slot of a summarised thread (NULL: the thread is reported exactly).
static __always_inline struct summary *summary_of(u32 tid)
{
    u32 *slot = summarised.lookup(&tid);
    if (!slot)
        return NULL;
    u32 index = *slot;
    return summaries.lookup(&index);
}

// Whether the switch-out now happening is inside sched_yield(): the kernel
// reports a yield exactly as a preemption (still runnable, counted in
// nivcsw), but the thread gave its CPU away itself, as a spinning waiter
// does (vLLM's shared-memory queue). Told by the system call the task is in:
// its saved user registers (bpf_task_pt_regs, the kernel's own helper, not a
// task_struct field) hold the call's number in orig_ax (-1 when it entered
// the kernel by an interrupt, the usual preemption). Only for preempted
// switch-outs of tracked threads; YIELD_NR (the architecture's
// __NR_sched_yield) comes from user space, which leaves it out where it
// does not know the layout (offcpu.yielded is then NULL). Not the kernel
// stack (bpf_get_stack: ~1.8 us a switch-out here) nor a syscall tracepoint
// (enabling one sends every syscall on the host through the slow path).
static __always_inline u8 in_yield(void)
{
#ifdef YIELD_NR
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    long nr = -1;
    if (!regs || bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax))
        return 0;
    return nr == YIELD_NR;
#else
    return 0;
#endif
}

// A tracked thread went to sleep and its CPU goes idle: the gap a waiter
// of the gap clock may have asked for. Two CPUs racing past the same due
// time write two kicks; user space reads them as one.
static __always_inline void gap_kick(u64 now)
{
    u32 zero = 0;
    u64 *due = gap_due.lookup(&zero);
    if (!due || now < *due)
        return;
    *due = ~0ULL;
    u64 *kick = gap_kicks.ringbuf_reserve(sizeof(u64));
    if (!kick)
        return;
    *kick = now;
    gap_kicks.ringbuf_submit(kick, BPF_RB_FORCE_WAKEUP);
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
        COUNT(state_full);
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    // The CPU is read only once a tracked thread is involved: almost every
    // switch on a host is not ours and should cost two lookups, one clock
    // read and one per-CPU store (cpu_switch_ns).
    u64 now = bpf_ktime_get_ns();
    u16 cpu = 0;
    // At sched_switch the current task is still prev, so this is prev's tgid.
    u32 prev_tgid = bpf_get_current_pid_tgid() >> 32;
    u32 prev_tid = args->prev_pid;
    u32 next_tid = args->next_pid;

    // Nobody schedules from interrupt context: a depth left over from an
    // exit the kernel did not report must not outlive this switch.
    u32 zero = 0;
    u32 *depth = irq_depth.lookup(&zero);
    if (depth && *depth)
        *depth = 0;

    // Since when prev has held this CPU; from now on, next holds it.
    u64 since = 0;
    u64 *slot = cpu_switch_ns.lookup(&zero);
    if (slot) {
        since = *slot;
        *slot = now;
    }

    // Exiting threads (X or Z in prev_state) switch out one last time after
    // sched_process_exit: forget them instead of keeping a stale entry. A
    // summarised thread stays summarised until here: between
    // sched_process_exit and this switch it can still block or be preempted
    // (exit_mm, exit_files, ...), and those switches belong in its totals,
    // not in exact records.
    if (prev_tid != 0 && (args->prev_state & 0x30)) {
        struct summary *last = summary_of(prev_tid);
        if (last) {
            if (last->tid == prev_tid && last->in_ns && now > last->in_ns)
                last->oncpu_ns += now - last->in_ns;
            last->in_ns = 0;
            summarised.delete(&prev_tid);
        }
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
        // next_pid 0 is the CPU's idle task: nothing else was queued there.
        if (!preempted && next_tid == 0)
            gap_kick(now);
        cpu = bpf_get_smp_processor_id();
        struct tstate *s = state.lookup(&prev_tid);
        if (!s) {
            struct tstate init = {};
            init.pid = prev_tgid;
            if (state.update(&prev_tid, &init))
                COUNT(state_full);
            // A thread we first meet here (a race with track()'s /proc scan)
            // must also be known to the wakeup and migration probes.
            tid_tgid.update(&prev_tid, &prev_tgid);
            s = state.lookup(&prev_tid);
        } else if (s->off_ns) {
            // A switch-out while the last one is still unpaired means the
            // kernel dropped a run of this program at the switch-in (seen
            // under concurrent tracing, not counted as a BPF miss): the
            // pending interval is lost; count it by kind.
            if (s->preempted)
                COUNT(lost_in_preempted);
            else
                COUNT(lost_in_voluntary);
        }
        struct summary *sum = summary_of(prev_tid);
        if (sum) {
            // Its on-CPU time: only from a switch-in this slot saw for it
            // (a slot handed on from an exited thread keeps its in_ns).
            if (sum->tid == prev_tid && sum->in_ns && now > sum->in_ns)
                sum->oncpu_ns += now - sum->in_ns;
            sum->in_ns = 0;
            sum->tid = prev_tid;
        }
        if (s) {
            s->off_ns = now;
            s->cpu = cpu;
            s->preempted = preempted;
            s->yielded = preempted ? in_yield() : 0;
            s->pid = prev_tgid;
            s->rq_ns = preempted ? now : 0;
            s->other_irq = 0;
            if (preempted) {
                s->n_inv++;
                // The preemptor is the task switched in now. Its tgid is known
                // here only if it is a thread we follow; otherwise it is filled
                // in at our switch-in if it is then the task leaving the CPU.
                s->other_tid = next_tid;
                u32 *ptgid = tid_tgid.lookup(&next_tid);
                s->other_pid = ptgid ? *ptgid : 0;
                __builtin_memcpy(s->other_comm, args->next_comm, COMM_LEN);
            } else {
                s->n_vol++;
                s->other_tid = 0;
                s->other_pid = 0;
            }
        }
    }

    struct tstate *n = state.lookup(&next_tid);
    if (!n)
        return KEEP_PERF_EVENT;
    if (!n->off_ns && !n->rq_ns) {
        struct summary *sn = summary_of(next_tid);
        if (sn) {  // first switch-in seen since it was summarised: on CPU from now
            sn->tid = next_tid;
            sn->in_ns = now;
        }
        return KEEP_PERF_EVENT;
    }
    u32 pid = n->pid;
    if (!tracked.lookup(&pid)) {
        // untracked since: forget it
        state.delete(&next_tid);
        return KEEP_PERF_EVENT;
    }
    if (!cpu)
        cpu = bpf_get_smp_processor_id();
    struct summary *sum = summary_of(next_tid);
    if (sum) {
        // Summarised: totals instead of a record.
        if (n->off_ns && now > n->off_ns) {
            sum->offcpu_ns += now - n->off_ns;
            sum->switches += 1;
            if (n->preempted) {
                sum->preempted_ns += now - n->off_ns;
                sum->preemptions += 1;
            }
        }
        if (n->rq_ns && now > n->rq_ns)
            sum->runq_ns += now - n->rq_ns;
        sum->tid = next_tid;
        sum->in_ns = now;
        n->off_ns = 0;
        n->rq_ns = 0;
        n->other_tid = 0;
        n->other_pid = 0;
        n->other_irq = 0;
        return KEEP_PERF_EVENT;
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
    r.yielded = n->yielded;
    r.other_irq = n->other_irq;
    r.other_tid = n->other_tid;
    r.other_pid = n->other_pid;
    // Often the preemptor is the very task handing the CPU back: then its
    // tgid is the current one.
    if (n->preempted && !r.other_pid && r.other_tid && r.other_tid == prev_tid)
        r.other_pid = prev_tgid;
    __builtin_memcpy(r.other_comm, n->other_comm, COMM_LEN);
    // Who held this CPU until now, and since when.
    r.prev_pid = prev_tid ? prev_tgid : 0;
    if (since && now > since)
        r.prev_run_ns = now - since;
    __builtin_memcpy(r.prev_comm, args->prev_comm, COMM_LEN);
    n->off_ns = 0;
    n->rq_ns = 0;
    n->other_tid = 0;
    n->other_pid = 0;
    n->other_irq = 0;
    emit(&r);
    return KEEP_PERF_EVENT;
}

// Runs in the waker's context (try_to_wake_up, before the task is queued),
// and only for a task that really sleeps (ttwu_state_match). The first
// wakeup of a blocked interval names the waker: the current thread, unless
// the CPU is in interrupt context (a device IRQ, a softirq such as network
// receive or timers, an hrtimer callback such as a sleep or futex timeout)
// or idle (pid 0): then no thread woke it and other_irq says so.
TRACEPOINT_PROBE(sched, sched_waking)
{
    u32 tid = args->pid;
    struct tstate *s = state.lookup(&tid);
    if (!s || !s->off_ns || s->preempted || s->other_tid || s->other_irq)
        return KEEP_PERF_EVENT;
    u64 id = bpf_get_current_pid_tgid();
    u32 zero = 0;
    u32 *depth = irq_depth.lookup(&zero);
    if ((u32)id == 0 || (depth && *depth)) {
        s->other_irq = 1;
        return KEEP_PERF_EVENT;
    }
    s->other_pid = id >> 32;
    bpf_get_current_comm(&s->other_comm, sizeof(s->other_comm));
    s->other_tid = (u32)id;
    return KEEP_PERF_EVENT;
}

static __always_inline void irq_enter(void)
{
    u32 zero = 0;
    u32 *depth = irq_depth.lookup(&zero);
    if (depth)
        *depth += 1;
}

static __always_inline void irq_leave(void)
{
    u32 zero = 0;
    u32 *depth = irq_depth.lookup(&zero);
    if (depth && *depth)
        *depth -= 1;
}

TRACEPOINT_PROBE(irq, irq_handler_entry) { irq_enter(); return KEEP_PERF_EVENT; }
TRACEPOINT_PROBE(irq, irq_handler_exit) { irq_leave(); return KEEP_PERF_EVENT; }
TRACEPOINT_PROBE(irq, softirq_entry) { irq_enter(); return KEEP_PERF_EVENT; }
TRACEPOINT_PROBE(irq, softirq_exit) { irq_leave(); return KEEP_PERF_EVENT; }
TRACEPOINT_PROBE(timer, hrtimer_expire_entry) { irq_enter(); return KEEP_PERF_EVENT; }
TRACEPOINT_PROBE(timer, hrtimer_expire_exit) { irq_leave(); return KEEP_PERF_EVENT; }

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
    struct summary *sum = summary_of(tid);
    if (sum) {
        // Runs on another CPU than the thread's own switches: atomically.
        __sync_fetch_and_add(&sum->migrations, 1);
        return KEEP_PERF_EVENT;
    }
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
    // A reused tid starts exact, whatever an exited thread left behind.
    summarised.delete(&tid);
    return KEEP_PERF_EVENT;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 tid = args->pid;
    tid_tgid.delete(&tid);
    state.delete(&tid);
    // `summarised` is kept until the final switch-out (sched_switch) or
    // until user space sees the thread gone: the exit path still switches.
    return KEEP_PERF_EVENT;
}
