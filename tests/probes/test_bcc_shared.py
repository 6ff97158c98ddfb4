"""The BPF C every probe program repeats is the same in each copy.

bcc rewrites map calls (`tracked.lookup`, `events.ringbuf_reserve`) only in
the program's main file, so the maps and the helpers that use them cannot
be moved into a shared header: each program carries them. These tests keep
the copies identical: the kernel-cause programs' whole preamble (between
its markers), and in every `*_bcc.c` the counters/COUNT/emit helpers.
"""

import re
from pathlib import Path

import pytest

PROBES = Path(__file__).resolve().parents[2] / "daemon" / "stallscope" / "probes"
KCAUSE = ("faults_bcc.c", "irq_bcc.c", "syscalls_bcc.c", "cuda_bcc.c")
BEGIN, END = "// >>> shared preamble", "// <<< shared preamble"


def preamble(name):
    text = (PROBES / name).read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{name}: one pair of markers"
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def helper(text, start):
    """The definition that starts with `start`, up to its closing line."""
    i = text.index(start)
    closing = "while (0)\n" if start.startswith("#define") else "\n}\n"
    return text[i : text.index(closing, i) + len(closing)]


HELPERS = (
    "static __always_inline struct counters *counters_ptr(void)",
    "#define COUNT(field)",
    "static __always_inline void emit(struct record *r)",
)


def test_the_kernel_cause_preambles_are_identical():
    first = preamble(KCAUSE[0])
    assert "BPF_HASH(tracked" in first and "tracked_tgid" in first
    for name in KCAUSE[1:]:
        assert preamble(name) == first, f"{name} differs from {KCAUSE[0]}"


@pytest.mark.parametrize("start", HELPERS)
def test_every_program_has_the_same_helper(start):
    """Every program with one record type and one ring (sched and the kernel
    causes) defines the helper identically; the CPU sampler, which writes two
    record types to two rings, has its own emitters."""
    programs = [p for p in sorted(PROBES.glob("*_bcc.c")) if start in p.read_text()]
    assert {p.name for p in programs} >= {"sched_bcc.c", *KCAUSE}
    copies = {p.name: helper(p.read_text(), start) for p in programs}
    assert len(set(copies.values())) == 1, {k: v[:80] for k, v in copies.items()}


def test_a_changed_copy_is_caught():
    text = (PROBES / KCAUSE[1]).read_text()
    changed = re.sub(r"BPF_RB_NO_WAKEUP", "0", text, count=1)
    assert helper(changed, HELPERS[2]) != helper(text, HELPERS[2])
