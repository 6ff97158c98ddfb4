// Layouts of irq_bcc.c, read by irq_bcc.py from the compiled program.

#ifndef STALLSCOPE_IRQ_BCC_H
#define STALLSCOPE_IRQ_BCC_H

#define IRQ_KIND_HARD 0
#define IRQ_KIND_SOFT 1

// One hard IRQ handler or softirq run while a tracked thread was current.
struct record {
    u64 start_ns;
    u64 end_ns;
    u32 pid;
    u32 tid;
    u32 vec;         // IRQ number (hard) or softirq vector (soft)
    u16 cpu;
    u8 kind;         // IRQ_KIND_*
    u8 pad;
};

// What is pending per CPU between an entry and its exit.
struct pending {
    u64 start_ns;
    u32 pid;
    u32 tid;
    u32 vec;
    u32 active;
};

struct counters {
    u64 reserve_failed;   // ring buffer full
};

#endif
