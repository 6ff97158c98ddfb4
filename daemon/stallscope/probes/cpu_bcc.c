// Python-aware CPU sampler: stacks of tracked processes at a timer tick.
//
// Loaded by cpu_bcc.py and attached with bcc `attach_perf_event` to one
// software cpu-clock event per CPU (PERF_TYPE_SOFTWARE /
// PERF_COUNT_SW_CPU_CLOCK, period 1e9/cpu_sample_hz ns), only while some
// process is tracked; or, built with TICK_CLOCK (cpu_sample_clock = "tick"),
// on the scheduler's own tick (the timer:hrtimer_expire_entry tracepoint,
// see below), attached the same way. Needs CAP_BPF + CAP_PERFMON (or root); no
// tracepoint, kprobe or fentry. Settings arrive as cflags (MAX_DEPTH,
// MAX_WALK, MAX_NEW_SYMS, SYM_*_LEN, map sizes, ring pages); layouts live
// in cpu_bcc.h.
//
// Per tick: a process not in `tracked` costs one hash lookup and nothing
// else. For a tracked one, one `sample` record: time, pid/tid/cpu, whether
// the CPU was in kernel mode (the interrupted regs' CS privilege level), the
// native leaf IP (the interrupted user IP, or in kernel mode the first frame
// of bpf_get_stack(BPF_F_USER_STACK)), and up to MAX_DEPTH Python frames as
// (code address, instruction index, checksum). The thread state comes from
// `tstates` (tid -> PyThreadState address), which user space fills from what
// the traced process itself reports over its probe connection: no
// task_struct read, no TLS/fsbase lookup (kernel headers may not match the
// running kernel, so such reads return garbage). A thread not reported yet
// (just started) is found as the GIL holder (`last_holder`, whose address
// the process also reports) when its native thread id matches, and is then
// remembered in `tstates`. The interpreter's layout (offsets per version) is
// the `tracked` map's value; frame_kind 0 (no usable layout: an unknown or
// refused interpreter, or no report yet) samples the native leaf only.
//
// The sampled thread is stopped on this CPU while we read it, so its own
// frame chain is consistent; every value read is still untrusted: the frame
// walk is bounded (MAX_WALK links, MAX_DEPTH kept: the verifier needs a
// constant bound, its work grows linearly with it, and the record has a
// fixed size), every code pointer must have ob_type == &PyCode_Type,
// C-stack shim frames (owner == FRAME_OWNED_BY_CSTACK) and incomplete
// frames (not past _co_firsttraceable, as CPython's own
// _PyFrame_IsIncomplete) are skipped.
//
// Symbols: the first time a (tgid, code address, checksum) appears (an LRU
// `seen` map), its qualname, filename, co_firstlineno and line table are
// copied into a `symbol` record (a second ring), at most MAX_NEW_SYMS per
// tick, committed before the sample that holds it. The checksum mixes
// stable code-object fields (name, filename and line table pointers,
// firstlineno, argcount, flags), so a freed code object whose address is
// reused by another gets a new checksum, a new symbol record, and is never
// named after the old one.

#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include "cpu_bcc.h"

#ifndef MAX_TGIDS
#define MAX_TGIDS 1024
#endif
#ifndef MAX_TIDS
#define MAX_TIDS 65536
#endif
#ifndef MAX_SYMBOLS
#define MAX_SYMBOLS 65536
#endif
#ifndef SAMPLE_RING_PAGES
#define SAMPLE_RING_PAGES 512
#endif
#ifndef SYMBOL_RING_PAGES
#define SYMBOL_RING_PAGES 256
#endif
#ifndef MAX_WALK
#define MAX_WALK (MAX_DEPTH + 8)    // frame links followed (skipped frames count)
#endif
#ifndef MAX_NEW_SYMS
#define MAX_NEW_SYMS 4              // symbol records per tick (<= 4: scratch.pending)
#endif

BPF_HASH(tracked, u32, struct pylayout, MAX_TGIDS);   // tgid -> its interpreter's layout
BPF_HASH(tstates, u32, u64, MAX_TIDS);                // tid -> PyThreadState address
BPF_TABLE("lru_hash", struct symkey, u8, seen, MAX_SYMBOLS);
BPF_RINGBUF_OUTPUT(samples, SAMPLE_RING_PAGES);
BPF_RINGBUF_OUTPUT(symbols, SYMBOL_RING_PAGES);
// Mmapped by user space and read without a bpf() syscall.
BPF_F_TABLE("array", u32, struct counters, counters, 1, BPF_F_MMAPABLE);
BPF_PERCPU_ARRAY(scratch, struct scratch, 1);
// Never written: their value types tell user space the compiled layouts.
BPF_ARRAY(layout_sample, struct sample, 1);
BPF_ARRAY(layout_symbol, struct symbol, 1);

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

// Fields of an object head copied into scratch, at an offset from user
// space: masked to the (power-of-two) buffer and the field's alignment, so
// the verifier sees a bounded access and a bad offset reads scratch, not
// beyond it.
#define RD64(buf, size, off) (*(u64 *)((u8 *)(buf) + ((u32)(off) & ((size) - 8))))
#define RD32(buf, size, off) (*(u32 *)((u8 *)(buf) + ((u32)(off) & ((size) - 4))))
#define RD8(buf, size, off) (*((u8 *)(buf) + ((u32)(off) & ((size) - 1))))

static __always_inline u64 mix(u64 h, u64 v)
{
    h ^= v;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

// Checksum of the code object head in s->code.
static __always_inline u32 code_cksum(struct pylayout *L, struct scratch *s)
{
    u64 h = 0x9e3779b97f4a7c15ULL;
    h = mix(h, RD64(s->code, CODE_HEAD, L->co_name));
    h = mix(h, RD64(s->code, CODE_HEAD, L->co_filename));
    h = mix(h, RD64(s->code, CODE_HEAD, L->co_linetable));
    h = mix(h, ((u64)RD32(s->code, CODE_HEAD, L->co_firstlineno) << 32) |
                   RD32(s->code, CODE_HEAD, L->co_argcount));
    h = mix(h, RD32(s->code, CODE_HEAD, L->co_flags));
    return (u32)(h >> 32) ^ (u32)h;
}

// min(n, cap), in a register the compiler cannot swap for the unclamped
// copy (the verifier must see the bound on the very register passed as a size)
static __always_inline u64 cap_len(u64 n, u64 cap)
{
    if (n > cap)
        n = cap;
    asm volatile("" : "+r"(n));
    return n;
}

// A str object's bytes into dst (cap bytes, a power of two); the tail when
// `tail` and the string is longer than cap.
static __always_inline void read_str(struct pylayout *L, struct scratch *s, u64 obj,
                                     u8 *dst, u32 cap, int tail, u32 *full_len,
                                     u16 *copied, u8 *enc)
{
    *full_len = 0;
    *copied = 0;
    *enc = PYSTR_NONE;
    if (!obj)
        return;
    *enc = PYSTR_BAD;
    if (bpf_probe_read_user(s->str, cap_len(L->str_read, STR_HEAD), (void *)obj))
        return;
    if (RD64(s->str, STR_HEAD, L->ob_type) != L->str_type)
        return;
    u64 length = RD64(s->str, STR_HEAD, L->str_length);
    u32 state = RD32(s->str, STR_HEAD, L->str_state);
    u32 kind = (state >> 2) & 7;
    u64 data;
    u64 n;
    u8 e;
    if (!((state >> 5) & 1))
        return;                              // not compact (legacy str): not read
    if ((state >> 6) & 1) {                  // compact ASCII
        data = obj + L->str_ascii_data;
        n = length;
        e = PYSTR_ASCII;
    } else {
        u64 utf8[2] = {};                    // utf8_length, utf8
        if (bpf_probe_read_user(utf8, sizeof(utf8), (void *)(obj + L->str_utf8_length)))
            return;
        if (utf8[1]) {
            data = utf8[1];
            n = utf8[0];
            e = PYSTR_UTF8;
        } else if (kind == 1 || kind == 2 || kind == 4) {
            data = obj + L->str_compact_data;
            n = length * kind;
            e = kind == 1 ? PYSTR_UCS1 : (kind == 2 ? PYSTR_UCS2 : PYSTR_UCS4);
        } else {
            return;
        }
    }
    if (n > 0x7fffffff)
        return;
    *full_len = (u32)n;
    if (tail && n > cap)
        data += n - cap;                     // cap is a multiple of 4: chars stay whole
    u64 m = cap_len(n, cap);
    if (bpf_probe_read_user(dst, m, (void *)data))
        return;
    *copied = m;
    *enc = e;
}

static __always_inline void emit_symbol(struct pylayout *L, struct scratch *s,
                                        struct symkey *k)
{
    struct symbol *y = symbols.ringbuf_reserve(sizeof(struct symbol));
    if (!y) {
        COUNT(sym_reserve_failed);
        seen.delete(k);                      // not sent: try again at a later tick
        return;
    }
    y->code = k->code;
    y->cksum = k->cksum;
    y->pid = k->pid;
    y->firstlineno = 0;
    y->name_len = y->file_len = y->linetable_len = 0;
    y->name_copied = y->file_copied = y->linetable_copied = 0;
    y->name_enc = y->file_enc = PYSTR_BAD;
    if (bpf_probe_read_user(s->code, cap_len(L->code_read, CODE_HEAD), (void *)k->code) ||
        RD64(s->code, CODE_HEAD, L->ob_type) != L->code_type ||
        code_cksum(L, s) != k->cksum) {
        // gone or changed since the frame walk: an unnamed symbol, never a wrong one
        symbols.ringbuf_submit(y, BPF_RB_NO_WAKEUP);
        COUNT(sym_sent);
        return;
    }
    y->firstlineno = (s32)RD32(s->code, CODE_HEAD, L->co_firstlineno);
    u64 name = RD64(s->code, CODE_HEAD, L->co_name);
    u64 file = RD64(s->code, CODE_HEAD, L->co_filename);
    u64 lt = RD64(s->code, CODE_HEAD, L->co_linetable);
    read_str(L, s, name, y->name, SYM_NAME_LEN, 0, &y->name_len, &y->name_copied, &y->name_enc);
    read_str(L, s, file, y->file, SYM_FILE_LEN, 1, &y->file_len, &y->file_copied, &y->file_enc);
    // the line table: a bytes object
    u64 hdr[4] = {};
    if (lt && !bpf_probe_read_user(hdr, sizeof(hdr), (void *)lt) &&
        RD64(hdr, 32, L->ob_type) == L->bytes_type) {
        u64 len = RD64(hdr, 32, L->bytes_size);
        if (len <= 0x7fffffff) {
            y->linetable_len = (u32)len;
            u64 m = cap_len(len, SYM_LINETABLE_LEN);
            if (!bpf_probe_read_user(y->linetable, m, (void *)(lt + L->bytes_data)))
                y->linetable_copied = m;
        }
    }
    symbols.ringbuf_submit(y, BPF_RB_NO_WAKEUP);
    COUNT(sym_sent);
}

// Is the tstate head in s->tstate the one of thread `tid`? 1 yes, 0 no,
// -1 cannot tell (no native_thread_id and no libc tid offset).
static __always_inline int tstate_is(struct pylayout *L, struct scratch *s, u32 tid)
{
    if (L->ts_native_tid >= 0)
        return RD32(s->tstate, TSTATE_HEAD, L->ts_native_tid) == tid;
    if (L->ts_pthread >= 0 && L->pthread_tid >= 0) {
        // 3.10: tstate->thread_id is pthread_self(), libc's thread
        // descriptor, which holds the kernel tid at a fixed offset
        u64 pt = RD64(s->tstate, TSTATE_HEAD, L->ts_pthread);
        u32 t = 0;
        if (!pt || bpf_probe_read_user(&t, sizeof(t), (void *)(pt + L->pthread_tid)))
            return 0;
        return t == tid;
    }
    return -1;
}

#ifdef TICK_CLOCK
// The scheduler's own tick as the clock (cpu_sample_clock = "tick"): no
// interrupt of our own (one costs a torch thread ~100 us on a VM here). The
// program runs at the expiry of every hrtimer and keeps only TICK_FN's (the
// tick handler, from kallsyms). The tracepoint has no interrupted registers:
// the tick came from user mode when the deepest frame of the kernel stack
// is the timer interrupt's entry [IRQ_ENTRY_LO, IRQ_ENTRY_HI) (a system call
// or a fault ends in its own entry; a stack that fills the buffer is kernel
// mode too), and the user IP is the first frame of the user stack (the
// registers saved at the last entry into the kernel).
#define TICK_KSTACK 32
struct kstack {
    u64 ip[TICK_KSTACK];
};
BPF_PERCPU_ARRAY(tick_kstack, struct kstack, 1);

static __always_inline int tick_kernel_mode(void *ctx)
{
    u32 zero = 0;
    struct kstack *k = tick_kstack.lookup(&zero);
    if (!k)
        return 1;
    long n = bpf_get_stack(ctx, k->ip, sizeof(k->ip), 0);
    if (n <= 0 || n >= (long)sizeof(k->ip))
        return 1;
    u32 last = ((u32)n / 8) - 1;
    u64 ip = k->ip[last & (TICK_KSTACK - 1)];
    return !(ip >= IRQ_ENTRY_LO && ip < IRQ_ENTRY_HI);
}

TRACEPOINT_PROBE(timer, hrtimer_expire_entry)
{
    if ((u64)args->function != TICK_FN)
        return 0;
    void *ctx = args;
#else
int on_sample(struct bpf_perf_event_data *ctx)
{
#endif
    u64 id = bpf_get_current_pid_tgid();
    u32 pid = id >> 32;
    struct pylayout *L = tracked.lookup(&pid);
    if (!L)
        return 0;
    u32 tid = (u32)id;
    u32 zero = 0;
    struct scratch *s = scratch.lookup(&zero);
    if (!s)
        return 0;
    struct sample *r = samples.ringbuf_reserve(sizeof(struct sample));
    if (!r) {
        COUNT(reserve_failed);
        return 0;
    }
    r->ts_ns = bpf_ktime_get_ns();
    r->pid = pid;
    r->tid = tid;
    r->cpu = bpf_get_smp_processor_id();
    r->status = CPU_OK;
    r->depth = 0;
    r->flags = 0;
    r->skipped = 0;
    r->pad = 0;
    r->user_ip = 0;
#ifdef TICK_CLOCK
    r->kernel_mode = tick_kernel_mode(ctx);
    {
        u64 ip = 0;
        if (bpf_get_stack(ctx, &ip, sizeof(ip), BPF_F_USER_STACK) > 0)
            r->user_ip = ip;
    }
#else
    // x86-64: the privilege level of the interrupted context is CS's low bits
    r->kernel_mode = (ctx->regs.cs & 3) != 3;
    if (!r->kernel_mode) {
        r->user_ip = ctx->regs.ip;
    } else {
        u64 ip = 0;
        if (bpf_get_stack(ctx, &ip, sizeof(ip), BPF_F_USER_STACK) > 0)
            r->user_ip = ip;
    }
#endif

    s->depth = 0;
    s->npend = 0;
    if (L->frame_kind == FRAMES_NONE) {
        r->status = CPU_NO_PYTHON;
        COUNT(no_python);
        goto out;
    }
    // The thread state: as reported by the process, checked against the tid
    // (tstate_is: a stale entry of a dead thread whose tid came back is
    // caught); if none, the GIL holder, which is the running thread's tstate
    // whenever it runs Python (same check, required), remembered in
    // `tstates` for the next ticks.
    u64 ts = 0;
    u64 ts_read = cap_len(L->ts_read, TSTATE_HEAD);
    u64 *tsp = tstates.lookup(&tid);
    if (tsp) {
        ts = *tsp;
        if (bpf_probe_read_user(s->tstate, ts_read, (void *)ts)) {
            ts = 0;
            COUNT(tstate_fault);
        } else if (tstate_is(L, s, tid) == 0) {
            ts = 0;
            COUNT(stale_tstate);
        }
    }
    if (!ts && L->gil_holder) {
        u64 holder = 0;
        if (!bpf_probe_read_user(&holder, sizeof(holder), (void *)L->gil_holder) && holder &&
            !bpf_probe_read_user(s->tstate, ts_read, (void *)holder) &&
            tstate_is(L, s, tid) == 1) {
            ts = holder;
            r->flags |= CPU_F_GIL_HOLDER;
            COUNT(gil_holder_used);
            tstates.update(&tid, &ts);
        }
    }
    if (!ts) {
        r->status = CPU_NO_TSTATE;
        COUNT(no_tstate);
        goto out;
    }
    u64 frame = RD64(s->tstate, TSTATE_HEAD, L->ts_frame);
    if (L->has_cframe && frame) {
        u64 cf = frame;
        frame = 0;
        if (bpf_probe_read_user(&frame, sizeof(frame), (void *)(cf + L->cframe_frame))) {
            r->status = CPU_TSTATE_FAULT;
            COUNT(tstate_fault);
            goto out;
        }
    }

    u64 fread = cap_len(L->frame_read, FRAME_HEAD);
    u64 cread = cap_len(L->code_read, CODE_HEAD);
    u32 skipped = 0;
    for (int i = 0; i < MAX_WALK; i++) {
        if (!frame || s->depth >= MAX_DEPTH)
            break;
        if (bpf_probe_read_user(s->frame, fread, (void *)frame)) {
            r->flags |= CPU_F_FAULT;
            COUNT(frame_fault);
            frame = 0;
            break;
        }
        u64 code = RD64(s->frame, FRAME_HEAD, L->f_code);
        u64 back = RD64(s->frame, FRAME_HEAD, L->f_back);
        s32 lasti;
        u32 owner = 0;
        if (L->frame_kind == FRAMES_OBJECT) {
            lasti = (s32)RD32(s->frame, FRAME_HEAD, L->f_instr);
        } else {
            owner = RD8(s->frame, FRAME_HEAD, L->f_owner);
            u64 instr = RD64(s->frame, FRAME_HEAD, L->f_instr);
            lasti = instr ? (s32)((s64)(instr - code - L->co_code_adaptive) >> 1) : -1;
        }
        frame = back;
        if (L->owner_cstack >= 0 && owner == (u32)L->owner_cstack) {
            skipped++;                       // C-stack shim frame
            continue;
        }
        if (!code || bpf_probe_read_user(s->code, cread, (void *)code)) {
            r->flags |= CPU_F_FAULT;
            COUNT(frame_fault);
            frame = 0;
            break;
        }
        if (RD64(s->code, CODE_HEAD, L->ob_type) != L->code_type) {
            skipped++;                       // f_executable not a code object
            COUNT(not_code);
            continue;
        }
        if (L->co_firsttraceable >= 0 && owner != 1 /* FRAME_OWNED_BY_GENERATOR */ &&
            lasti < (s32)RD32(s->code, CODE_HEAD, L->co_firsttraceable)) {
            skipped++;                       // incomplete: pushed, not started
            continue;
        }
        u32 d = s->depth;
        if (d >= MAX_DEPTH)
            break;
        r->frames[d].code = code;
        r->frames[d].lasti = lasti;
        r->frames[d].cksum = code_cksum(L, s);
        s->depth = d + 1;
    }
    if (frame) {
        r->flags |= CPU_F_TRUNCATED;
        COUNT(truncated);
    }
    r->depth = s->depth;
    r->skipped = skipped;

    // Code objects not sent yet (at most MAX_NEW_SYMS per tick)
    for (int j = 0; j < MAX_DEPTH; j++) {
        if (j >= s->depth || s->npend >= MAX_NEW_SYMS)
            break;
        struct symkey k = {};
        k.code = r->frames[j].code;
        k.cksum = r->frames[j].cksum;
        k.pid = pid;
        k.gen = L->gen;
        if (seen.lookup(&k))
            continue;
        u8 one = 1;
        seen.update(&k, &one);
        u32 p = s->npend;
        s->pending[p & 3] = k;
        s->npend = p + 1;
    }
out:
    // Symbols first: a reader that drains samples, then symbols, has every
    // symbol of every sample it read.
    for (int j = 0; j < MAX_NEW_SYMS; j++) {
        if (j >= s->npend)
            break;
        emit_symbol(L, s, &s->pending[j & 3]);
    }
    // The reader polls on a timer and drains in batches: no wakeup per record.
    samples.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
    COUNT(samples);
    return 0;
}
