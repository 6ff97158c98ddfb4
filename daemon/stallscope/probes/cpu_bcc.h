// Layouts shared by cpu_bcc.c and its reader, cpu_bcc.py: the one source.
//
// The reader takes each record's numpy dtype from the compiled program (the
// `layout_sample` and `layout_symbol` maps' value types, nested arrays
// included: bpf_common.struct_dtype), so a field added or resized here, or
// another MAX_DEPTH / SYM_* setting, reaches Python with it. `struct
// pylayout` is filled by field name from Python (bcc's ctypes Leaf of the
// `tracked` map); the #defines below are read by name
// (bpf_common.header_defines).

#ifndef STALLSCOPE_CPU_BCC_H
#define STALLSCOPE_CPU_BCC_H

#ifndef MAX_DEPTH
#define MAX_DEPTH 64          // Python frames kept per sample (innermost first)
#endif
#ifndef SYM_NAME_LEN
#define SYM_NAME_LEN 128      // qualname bytes (power of two)
#endif
#ifndef SYM_FILE_LEN
#define SYM_FILE_LEN 256      // filename bytes, the tail kept (power of two)
#endif
#ifndef SYM_LINETABLE_LEN
#define SYM_LINETABLE_LEN 1024  // line table bytes (power of two)
#endif

// Heads of objects read into per-CPU scratch (every field used lies within)
#define TSTATE_HEAD 256
#define FRAME_HEAD 128
#define CODE_HEAD 256
#define STR_HEAD 64

// sample status
#define CPU_OK 0              // frames walked (depth may be 0: no Python frame)
#define CPU_NO_TSTATE 1       // Python process, thread without a reported tstate
#define CPU_TSTATE_FAULT 2    // tstate or its frame pointer unreadable
#define CPU_NO_PYTHON 3       // no usable layout for this process: native leaf only

// sample flags
#define CPU_F_TRUNCATED 1     // more frames than MAX_DEPTH (outermost ones lost)
#define CPU_F_FAULT 2         // a frame or code object read failed: walk stopped
#define CPU_F_GIL_HOLDER 4    // tstate found as the GIL holder (not reported yet)

// frame kinds (probe_client/pyoffsets.py); 0 = native leaf only
#define FRAMES_NONE 0
#define FRAMES_OBJECT 1       // 3.10: PyFrameObject chain, f_lasti (code units)
#define FRAMES_PREV_INSTR 2   // 3.11/3.12: prev_instr pointer
#define FRAMES_INSTR_PTR 3    // 3.13: instr_ptr pointer

// string encodings of a symbol's name/file bytes
#define PYSTR_NONE 0          // null pointer / not read
#define PYSTR_ASCII 1         // compact ASCII data
#define PYSTR_UTF8 2          // compact non-ASCII, cached UTF-8
#define PYSTR_UCS1 3          // compact non-ASCII raw data, 1 byte a char (latin-1)
#define PYSTR_UCS2 4          // ... 2 bytes a char (UTF-16-LE, no surrogates)
#define PYSTR_UCS4 5          // ... 4 bytes a char (UTF-32-LE)
#define PYSTR_BAD 6           // not a str, not compact, or unreadable

// Where one interpreter keeps things (one per tracked tgid, from user space;
// every offset lies inside its *_read size, which is <= the matching *_HEAD:
// cpu_bcc.py checks before it writes the entry).
struct pylayout {
    u64 code_type;            // &PyCode_Type in that process
    u64 str_type;             // &PyUnicode_Type
    u64 bytes_type;           // &PyBytes_Type
    u64 gil_holder;           // &gil->last_holder (0: no fallback)
    u16 version;              // 0x030b for 3.11
    u8 frame_kind;            // FRAMES_*: 0 = native leaf only
    u8 has_cframe;            // 3.11/3.12: tstate -> cframe -> current_frame
    s16 owner_cstack;         // owner value of C-stack shim frames, -1 none
    s16 ts_native_tid;        // tstate -> native_thread_id (-1: none, 3.10)
    s16 ts_pthread;           // tstate -> thread_id (pthread_t = its struct pthread)
    s16 pthread_tid;          // struct pthread -> kernel tid (libc's, checked live; -1 none)
    u16 ts_read;              // tstate head bytes read
    u16 ts_frame;             // tstate -> frame (3.10), cframe, or current_frame (3.13)
    u16 cframe_frame;
    u16 f_code;
    u16 f_back;
    u16 f_instr;
    s16 f_owner;              // -1: no owner field (3.10)
    u16 frame_read;
    u16 co_argcount;
    u16 co_flags;
    u16 co_firstlineno;
    u16 co_name;              // co_qualname on 3.11+, co_name on 3.10
    u16 co_filename;
    u16 co_linetable;
    s16 co_firsttraceable;    // -1: none (3.10)
    u16 co_code_adaptive;
    u16 code_read;
    u16 ob_type;
    u16 str_length;
    u16 str_state;
    u16 str_ascii_data;
    u16 str_compact_data;
    u16 str_utf8_length;
    u16 str_utf8;
    u16 str_read;
    u16 bytes_size;
    u16 bytes_data;
    u16 pad;
    u32 gen;                  // this tracking of the tgid (symbols are re-sent for a new one)
    u32 pad2;
};

struct pyframe {
    u64 code;                 // code object address
    s32 lasti;                // instruction, in code units from co_code start (-1: none)
    u32 cksum;                // of stable code-object fields (address reuse guard)
};

// One per timer tick that found a tracked process on the CPU.
struct sample {
    u64 ts_ns;                // bpf_ktime_get_ns (CLOCK_MONOTONIC)
    u64 user_ip;              // native leaf (user mode: the interrupted IP;
                              // kernel mode: first user frame, 0 if none)
    u32 pid;
    u32 tid;
    u16 cpu;
    u8 kernel_mode;           // the CPU was in kernel mode at the tick
    u8 status;                // CPU_*
    u8 depth;                 // frames[] entries used
    u8 flags;                 // CPU_F_*
    u8 skipped;               // shim / incomplete / non-code frames passed over
    u8 pad;
    struct pyframe frames[MAX_DEPTH];  // only [0, depth) is written
};

// Sent once per (tgid, code address, checksum) the first time a sample holds
// it, committed before that sample (the reader reads samples, then symbols).
struct symbol {
    u64 code;
    u32 cksum;
    u32 pid;
    s32 firstlineno;
    u32 name_len;             // the string's full length (chars, or UTF-8 bytes)
    u32 file_len;
    u32 linetable_len;        // full length of co_linetable
    u16 name_copied;          // bytes in name[]
    u16 file_copied;          // bytes in file[] (the tail of the path when cut)
    u16 linetable_copied;
    u8 name_enc;              // PYSTR_*
    u8 file_enc;
    u8 name[SYM_NAME_LEN];    // raw bytes (UCS-2/4 data holds NULs)
    u8 file[SYM_FILE_LEN];
    u8 linetable[SYM_LINETABLE_LEN];
};

struct symkey {
    u64 code;
    u32 cksum;
    u32 pid;
    u32 gen;                  // pylayout.gen: a re-tracked process gets its symbols again
    u32 pad;
};

// Per-CPU scratch: object heads read in one probe read each, and the walk's
// counters (kept in map memory, not registers, so the verifier does not
// track their values: each loop iteration then looks the same to it and the
// program verifies in time linear in MAX_WALK, not exponential)
struct scratch {
    u8 tstate[TSTATE_HEAD];
    u8 frame[FRAME_HEAD];
    u8 code[CODE_HEAD];
    u8 str[STR_HEAD];
    struct symkey pending[4];
    u32 depth;
    u32 npend;
};

// Loss and health counters, one u64 each, read by name from user space.
struct counters {
    u64 samples;              // records written
    u64 reserve_failed;       // sample ring full: sample dropped
    u64 sym_sent;
    u64 sym_reserve_failed;   // symbol ring full: retried at a later sample
    u64 no_tstate;            // Python process, thread without reported tstate
    u64 gil_holder_used;      // ... found as the GIL holder instead (and remembered)
    u64 stale_tstate;         // reported tstate whose native_thread_id is another thread
    u64 tstate_fault;         // tstate or its frame pointer unreadable
    u64 frame_fault;          // frame or code head unreadable (walk stopped)
    u64 truncated;            // deeper than MAX_DEPTH
    u64 not_code;             // frame whose code pointer is not a code object
    u64 no_python;            // process without a usable layout (native leaf only)
};

#endif
