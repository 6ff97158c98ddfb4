"""A hostile client process for the fault suite: a flood of malformed datagrams.

Sends N malformed datagrams as fast as the daemon takes them: half on one
long-lived connection (no HELLO, bad magic, bad version, bad HELLO JSON),
half on short connections that each send a valid HELLO and then records
that regress or lie about their length. Touches
READY once started (after its first connection). Prints one JSON line: how
many it sent of each kind. Usage: python floodproc.py SOCKET N [--ready F]
"""

import json
import os
import socket
import sys
import time

from probe_client import wire


def _hdr(kind, count=0, first_seq=0, magic=wire.MAGIC, version=wire.VERSION, rsize=32):
    return wire.HEADER.pack(
        magic, version, kind, count, rsize, first_seq, time.monotonic_ns(), 0, 0
    )


def _records(n):
    return bytes([wire.REC_SPAN]) * 0 + b"".join(
        wire.RECORD.pack(wire.REC_SPAN, 0, 0, 0, 1, 2, 0, 0) for _ in range(n)
    )


def main(argv):
    path, n = argv[0], int(argv[1])
    ready = argv[argv.index("--ready") + 1] if "--ready" in argv else None
    recs = _records(wire.MAX_RECORDS)
    hello = json.dumps({"pid": os.getpid(), "run_token": 0, "label": "flood"}).encode()
    kinds = {
        "no_hello": _hdr(wire.DGRAM_RECORDS, wire.MAX_RECORDS) + recs,
        "bad_magic": _hdr(wire.DGRAM_RECORDS, magic=0x1234) + recs[:32],
        "bad_version": _hdr(wire.DGRAM_RECORDS, 1, version=99) + recs[:32],
        "length_mismatch": _hdr(wire.DGRAM_RECORDS, 3) + recs,
        "seq_regress": None,  # after a HELLO: first_seq behind what was sent
        "bad_hello": _hdr(wire.DGRAM_HELLO) + b"[" * 8000,
    }
    sent = dict.fromkeys(kinds, 0)
    long_lived = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    long_lived.connect(path)
    if ready:
        open(ready, "w").close()
    total = 0
    i = 0
    while total < n:
        i += 1
        # A short connection: a valid HELLO (a run), then malformed records.
        # The expensive kind: before runs were written in batches, each cost
        # the daemon ~2.7 ms.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(path)
        s.send(_hdr(wire.DGRAM_HELLO, first_seq=1000) + hello)
        bad = "seq_regress" if i % 2 else "length_mismatch"
        if bad == "seq_regress":
            s.send(_hdr(wire.DGRAM_RECORDS, wire.MAX_RECORDS, first_seq=5) + recs)
        else:
            s.send(kinds["length_mismatch"])
        sent[bad] += 1
        s.close()
        total += 1
        kind = ("no_hello", "bad_magic", "bad_version", "bad_hello")[i % 4]
        long_lived.send(kinds[kind])
        sent[kind] += 1
        total += 1
    long_lived.close()
    print(json.dumps({"sent": total, "by_kind": sent}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
