"""The CPU sampler's parts that need no kernel: record dtypes, line tables,
string decoding, layout checks on forged reports, and stack deduplication.

Line tables are checked against CPython itself: under each interpreter
(Debian's and pyenv's 3.10-3.13; missing ones skip, or fail under
STALLSCOPE_REQUIRE_PYTHONS=1) a helper dumps ~1,000 standard-library code
objects with `co_lines()`, and the daemon's decoder must give the same
line at every instruction, and never a wrong one from a cut table.
"""

import copy
import ctypes as ct
import json
import os
import subprocess

import numpy as np
import pytest

from helpers import pythons
from stallscope.probes import bpf_common, cpu_lines
from stallscope.probes.cpu_bcc import BccCpuProbe, Refused
from stallscope.probes.cpu_stacks import StackTable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DUMP = r"""
import json, sys, types
import asyncio, collections, email.message, json.decoder, logging, re, threading, argparse
out = []
def walk(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from walk(c)
for mod in (asyncio.base_events, collections, email.message, json.decoder, logging, re._parser
            if hasattr(re, "_parser") else re, threading, argparse):
    for obj in vars(mod).values():
        for f in [obj] + (list(vars(obj).values()) if isinstance(obj, type) else []):
            co = getattr(f, "__code__", None)
            if isinstance(co, types.CodeType):
                for c in walk(co):
                    out.append([c.co_linetable.hex(), c.co_firstlineno, list(c.co_lines())])
print(json.dumps({"version": list(sys.version_info[:2]), "codes": out}))
"""


class _Frame(ct.Structure):
    _fields_ = [("code", ct.c_uint64), ("lasti", ct.c_int32), ("cksum", ct.c_uint32)]


class _Rec(ct.Structure):
    _fields_ = [
        ("ts_ns", ct.c_uint64),
        ("comm", ct.c_char * 16),
        ("raw", ct.c_uint8 * 8),
        ("frames", _Frame * 4),
        ("__pad_0", ct.c_uint32),
        ("depth", ct.c_uint8),
    ]


def test_struct_dtype_reads_nested_structs_and_arrays_at_the_compilers_offsets():
    dt = bpf_common.struct_dtype(_Rec)
    assert dt.itemsize == ct.sizeof(_Rec)
    assert "__pad_0" not in dt.names
    assert dt.fields["comm"][0] == np.dtype("S16")  # kept as bytes, as before
    assert dt.fields["raw"][0].shape == (8,) and dt.fields["raw"][0].base == np.dtype("u1")
    frames = dt.fields["frames"][0]
    assert frames.shape == (4,) and frames.base.names == ("code", "lasti", "cksum")
    assert dt.fields["frames"][1] == _Rec.frames.offset
    assert dt.fields["depth"][1] == _Rec.depth.offset
    r = _Rec(ts_ns=7, comm=b"spin", depth=2)
    r.frames[1].code, r.frames[1].lasti, r.raw[3] = 0xABC, -1, 9
    got = np.frombuffer(bytes(r), dtype=dt)[0]
    assert got["frames"]["code"][1] == 0xABC and got["frames"]["lasti"][1] == -1
    assert got["raw"][3] == 9 and got["comm"] == b"spin" and got["depth"] == 2
    # the ring record view keeps the nesting
    ring = bpf_common.ring_record_dtype(dt)
    assert ring.fields["frames"][0] == frames and ring.fields["frames"][1] == 8 + _Rec.frames.offset


@pytest.mark.parametrize("label", [label for label, _ in pythons.interpreters()])
def test_line_tables_decode_as_cpython_says(label):
    python = pythons.require(dict(pythons.interpreters())[label], f"CPython {label}")
    out = subprocess.run([python, "-c", DUMP], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    dump = json.loads(out.stdout)
    version = tuple(dump["version"])
    codes = dump["codes"]
    assert len(codes) > 500
    checked = cut_wrong = 0
    for table_hex, first, lines in codes:
        table = bytes.fromhex(table_hex)
        lt = cpu_lines.LineTable(version, table, first)
        for start, end, line in lines:
            for off in range(start, end, 2):
                assert lt.line(off) == line, (label, first, start, end, line, off)
                checked += 1
        # cut at half: every answer is the right line or None, never another line
        half = cpu_lines.LineTable(version, table[: len(table) // 2], first, truncated=True)
        for start, _end, line in lines:
            got = half.line(start)
            if got is not None and got != line:
                cut_wrong += 1
    assert checked > 5_000 and cut_wrong == 0


def test_line_tables_and_strings_never_raise_on_garbage():
    rng = np.random.default_rng(1)
    for version in ((3, 10), (3, 11), (3, 12), (3, 13)):
        for _ in range(300):
            raw = rng.integers(0, 256, rng.integers(0, 64), dtype=np.uint8).tobytes()
            lt = cpu_lines.LineTable(version, raw, int(rng.integers(-5, 5000)), bool(_ % 2))
            for off in (-2, 0, 2, 10, 1000):
                got = lt.line(off)
                assert got is None or isinstance(got, int)
    enc = bpf_common.header_defines("cpu_bcc.h", "PYSTR_")
    assert cpu_lines.decode_str(b"f\xffoo", enc["PYSTR_UTF8"], 4) == "f\ufffdoo"
    assert cpu_lines.decode_str("函数".encode("utf-16-le"), enc["PYSTR_UCS2"], 4) == "函数"
    assert cpu_lines.decode_str(b"\x00\xd8\x00", enc["PYSTR_UCS2"], 3)  # odd, lone surrogate
    assert cpu_lines.decode_str(b"abc", enc["PYSTR_ASCII"], 10, tail=True) == "\u2026abc"
    assert cpu_lines.decode_str(b"abc", 99, 3) == "<unreadable>"
    assert cpu_lines.decode_str(b"", enc["PYSTR_NONE"], 0) is None


FORGED = {
    "unknown version 3.14": lambda r: r.update(version=[3, 14, 0]),
    "free-threaded": lambda r: r.update(free_threaded=True),
    "not CPython": lambda r: r.update(implementation="pypy"),
    "not verified": lambda r: r.update(verified=None),
    "client refused": lambda r: r.update(status="refused: because"),
    "missing field": lambda r: r["layout"].pop("f_back"),
    "field not an int": lambda r: r["layout"].update(f_back="8"),
    "offset outside the code head": lambda r: r["layout"].update(co_name=4000),
    "read above the program's buffer": lambda r: r["layout"].update(frame_read=4096),
    "unaligned pointer offset": lambda r: r["layout"].update(f_code=3),
    "negative offset": lambda r: r["layout"].update(co_filename=-8),
    "layout not an object": lambda r: r.update(layout=[1, 2]),
    "type address in the kernel": lambda r: r["types"].update(code=0xFFFF800000000000),
    "frame kind of another version": lambda r: r["layout"].update(frame_kind=1),
    "huge code offset": lambda r: r["layout"].update(co_code_adaptive=1 << 40),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_layouts_are_refused_with_a_reason(report, case):
    rep = copy.deepcopy(report)
    FORGED[case](rep)
    with pytest.raises((Refused, KeyError, TypeError, ValueError, AttributeError)):
        BccCpuProbe.check_layout(rep)


def test_the_real_layout_passes_and_fills_every_field(report):
    fields, version = BccCpuProbe.check_layout(report)
    assert version == (3, 11)
    assert fields["frame_kind"] == 2 and fields["has_cframe"] == 1
    assert fields["code_type"] == report["types"]["code"]
    assert fields["co_name"] == report["layout"]["co_qualname"]


def _records(rows, depth_max=4):
    dt = np.dtype(
        [
            ("ts_ns", "<u8"),
            ("user_ip", "<u8"),
            ("pid", "<u4"),
            ("tid", "<u4"),
            ("cpu", "<u2"),
            ("kernel_mode", "u1"),
            ("status", "u1"),
            ("depth", "u1"),
            ("flags", "u1"),
            ("frames", [("code", "<u8"), ("lasti", "<i4"), ("cksum", "<u4")], (depth_max,)),
        ]
    )
    recs = np.zeros(len(rows), dtype=dt)
    recs["frames"]["code"] = 0xDEAD  # garbage past depth, as a ring leaves it
    for i, (pid, tid, frames, status) in enumerate(rows):
        recs[i]["ts_ns"], recs[i]["pid"], recs[i]["tid"] = 1000 + i, pid, tid
        recs[i]["status"], recs[i]["depth"] = status, len(frames)
        for j, (code, lasti, cksum) in enumerate(frames):
            recs[i]["frames"][j] = (code, lasti, cksum)
    return recs


class _Sym:
    def __init__(self, name):
        self.name, self.file, self.firstlineno = name, "/x.py", 1

    def line(self, lasti):
        return 10 + lasti


def test_stacks_are_stored_once_and_an_unnamed_frame_is_never_misnamed():
    clock = [0]
    table = StackTable(symbolize=False, epoch_ns=100, clock=lambda: clock[0])
    table.symbols[(5, 0xA0, 1)] = _Sym("a")
    table.symbols[(5, 0xB0, 2)] = _Sym("b")
    chain = [(0xB0, 3, 2), (0xA0, 0, 1)]
    recs = _records([(5, 6, chain, 0)] * 50 + [(5, 6, [(0xB0, 4, 2), (0xA0, 0, 1)], 0)] * 10)
    out = table.resolve(recs)
    assert len(out["cpu_samples"]["ts_ns"]) == 60
    assert len(set(out["cpu_stacks"]["stack_id"].tolist())) == 2  # two distinct lines of b
    assert len(out["cpu_frames"]["frame_id"]) == 3  # b:13, b:14, a:10
    assert table.resolve(recs).keys() == {"cpu_samples"}  # nothing new the second time
    # the same address with another checksum (a reused address) is unknown, not "a"
    out = table.resolve(_records([(5, 6, [(0xA0, 0, 99)], 0)]))
    assert out["cpu_frames"]["function"].to_pylist() == ["<unknown>"]
    # no frame and no leaf: stack_id NULL; the unwinder's reason is kept
    out = table.resolve(_records([(5, 6, [], 3)]))
    assert out["cpu_samples"]["stack_id"].to_pylist() == [None]
    assert out["cpu_samples"]["unwind"].to_pylist() == ["no_python"]
    # a new epoch: the same content under new ids (older ones may be deleted)
    clock[0] = 1000
    out = table.resolve(recs[:1])
    assert len(out["cpu_frames"]["frame_id"]) == 2 and len(out["cpu_stacks"]["stack_id"]) == 2


def test_batch_grouping_matches_numpy_unique_even_when_every_hash_collides(monkeypatch):
    from stallscope.probes import cpu_stacks

    rng = np.random.default_rng(7)
    keys = rng.integers(0, 3, (500, 9)).astype(np.uint64)  # few values: many equal rows
    pid = rng.choice([5, 7, 2**22], 500).astype(np.uint32)
    ip = rng.choice([0, 0x1000, 2**47 - 1], 500).astype(np.uint64)

    def exact(rows):
        _, first, inv = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        return first, inv.ravel()

    for mix in (bpf_common._ROW_MIX.copy(), np.zeros_like(bpf_common._ROW_MIX)):
        monkeypatch.setattr(bpf_common, "_ROW_MIX", mix)  # zeros: one hash for every row
        first, inv = bpf_common.unique_rows(keys)
        want_first, want_inv = exact(keys)
        # the same partition of the rows, each group named by its first row
        assert np.array_equal(keys[first[inv]], keys)
        assert sorted(first.tolist()) == sorted(want_first.tolist())
        assert len(set(zip(inv.tolist(), want_inv.tolist(), strict=True))) == len(want_first)
    first, inv = cpu_stacks._unique_pairs(pid, ip)
    pairs = np.stack([pid.astype(np.uint64), ip], axis=1)
    want_first, _ = exact(pairs)
    assert np.array_equal(pairs[first[inv]], pairs) and len(first) == len(want_first)
