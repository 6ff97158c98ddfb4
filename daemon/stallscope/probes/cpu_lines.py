"""CPU sampler symbols: a code object's line table and strings, as read by BPF.

The sampler's BPF side (cpu_bcc.c) copies a code object's qualname,
filename, co_firstlineno and `co_linetable` (bounded, possibly truncated)
out of the traced process into a `symbol` record. This module turns such a
record into a `Symbol`, whose `line(lasti)` maps a sampled instruction to a
line number the way CPython's own `PyCode_Addr2Line` does, per format:

- 3.10: pairs (bytecode delta in bytes, unsigned; line delta, signed, -128 =
  no line) (`Objects/lnotab_notes.txt` of 3.10);
- 3.11+: the location table (`Objects/locations.md`): entries whose first
  byte has bit 7 set, bits 3-6 the code, bits 0-2 the length in code units
  minus one; codes 13/14 carry a signed varint line delta, 10-12 a delta of
  0-2, 15 no location, 0-9 the same line.

Every byte came from the traced process and is untrusted: lengths are
bounded by the bytes present, a truncated table loses its last (possibly
partial) entry and answers None past the cut, bad UTF-8 or UCS data is
replaced, and nothing here raises on malformed input.
"""

import bisect

from stallscope.probes import bpf_common

_ENC = {v: k for k, v in bpf_common.header_defines("cpu_bcc.h", "PYSTR_").items()}


def _ranges_310(table, firstlineno, truncated):
    # pairs are self-contained: a cut table only loses its odd last byte
    line = firstlineno
    addr = 0
    n = len(table) - (len(table) & 1)
    out = []
    for i in range(0, max(n, 0), 2):
        sdelta = table[i]
        ldelta = table[i + 1]
        if ldelta >= 128:
            ldelta -= 256
        start = addr
        addr += sdelta
        if ldelta == -128:
            rline = None
        else:
            line += ldelta
            rline = line
        if addr > start:
            out.append((start, addr, rline))
    return out


def _varint(table, i, end):
    """(value, next index) of an unsigned varint at table[i:end], or (None, end)."""
    shift = 0
    val = 0
    while i < end and shift < 64:
        b = table[i]
        i += 1
        val |= (b & 63) << shift
        if not b & 64:
            return val, i
        shift += 6
    return None, end


def _svarint(table, i, end):
    val, i = _varint(table, i, end)
    if val is None:
        return None, i
    return (-(val >> 1) if val & 1 else val >> 1), i


def _ranges_311(table, firstlineno, truncated):
    n = len(table)
    # entry starts: bytes with bit 7 set; an entry ends where the next starts
    starts = [i for i in range(n) if table[i] & 0x80]
    bounds = starts[1:] + [n]
    count = len(starts)
    if truncated:
        count -= 1  # the last entry may have lost bytes at the cut
    out = []
    line = firstlineno
    addr = 0
    for k in range(max(count, 0)):
        i = starts[k]
        end = bounds[k]
        first = table[i]
        code = (first >> 3) & 15
        length = (first & 7) + 1
        start = addr
        addr += length * 2
        if code == 15:
            rline = None
        elif code in (13, 14):
            delta, _ = _svarint(table, i + 1, end)
            if delta is None:
                return out  # malformed: stop, keep what is sure
            line += delta
            rline = line
        elif code >= 10:
            line += code - 10
            rline = line
        else:
            rline = line
        out.append((start, addr, rline))
    return out


def address_ranges(version, table, firstlineno, truncated=False):
    """[(start byte, end byte, line or None)] of a line table, per `version`
    ((3, 10), (3, 11), ...)."""
    try:
        table = bytes(table)
        firstlineno = int(firstlineno)
        if tuple(version[:2]) < (3, 11):
            return _ranges_310(table, firstlineno, truncated)
        return _ranges_311(table, firstlineno, truncated)
    except Exception:  # untrusted bytes: never raise
        return []


class LineTable:
    """Ranges of one code object, looked up by instruction byte offset."""

    __slots__ = ("ranges", "starts", "end")

    def __init__(self, version, table, firstlineno, truncated=False):
        self.ranges = address_ranges(version, table, firstlineno, truncated)
        self.starts = [r[0] for r in self.ranges]
        self.end = self.ranges[-1][1] if self.ranges else 0

    def line(self, byte_offset):
        """The line of the instruction at `byte_offset`, None when unknown
        (no line, beyond a truncated table, negative offset)."""
        if byte_offset < 0 or byte_offset >= self.end:
            return None
        k = bisect.bisect_right(self.starts, byte_offset) - 1
        if k < 0:
            return None
        start, end, line = self.ranges[k]
        return line if start <= byte_offset < end else None


def decode_str(raw, enc, full_len, tail=False):
    """Text of a symbol string field (raw bytes, a PYSTR_* encoding, the
    string's full length); never raises. A cut string is marked with an
    ellipsis: at the start when `tail` (a path keeps its end)."""
    name = _ENC.get(int(enc), "PYSTR_BAD")
    raw = bytes(raw)
    try:
        if name in ("PYSTR_ASCII", "PYSTR_UTF8"):
            text = raw.decode("utf-8", "replace")
        elif name == "PYSTR_UCS1":
            text = raw.decode("latin-1")
        elif name == "PYSTR_UCS2":
            text = raw[: len(raw) & ~1].decode("utf-16-le", "replace")
        elif name == "PYSTR_UCS4":
            text = raw[: len(raw) & ~3].decode("utf-32-le", "replace")
        elif name == "PYSTR_NONE":
            return None
        else:
            return "<unreadable>"
    except Exception:  # untrusted bytes: never raise
        return "<undecodable>"
    if len(raw) < full_len:
        text = "\u2026" + text if tail else text + "\u2026"
    return text


class Symbol:
    """One code object of one process (pid, address, checksum), named."""

    __slots__ = ("name", "file", "firstlineno", "lines", "linetable_cut")

    def __init__(self, rec, version):
        """`rec`: one `symbol` record (numpy); `version`: (3, 11), ..."""
        self.name = decode_str(
            rec["name"][: min(int(rec["name_copied"]), len(rec["name"]))],
            rec["name_enc"],
            int(rec["name_len"]),
        )
        self.file = decode_str(
            rec["file"][: min(int(rec["file_copied"]), len(rec["file"]))],
            rec["file_enc"],
            int(rec["file_len"]),
            tail=True,
        )
        self.firstlineno = int(rec["firstlineno"])
        n = min(int(rec["linetable_copied"]), len(rec["linetable"]))
        self.linetable_cut = n < int(rec["linetable_len"])
        self.lines = LineTable(
            version, rec["linetable"][:n].tobytes(), self.firstlineno, self.linetable_cut
        )

    def line(self, lasti):
        """The line of instruction `lasti` (code units), None when unknown."""
        if lasti < 0:
            return self.firstlineno  # not started: CPython says co_firstlineno too
        return self.lines.line(lasti * 2)
