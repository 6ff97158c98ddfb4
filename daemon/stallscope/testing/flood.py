"""A flood sender: one probe connection sending full datagrams of span
records as fast as the daemon takes them, for the memory-bound test and the
footprint benchmark.

Usage: python flood.py SOCKET SECONDS TOKEN. Speaks the wire protocol
directly (no probe client, so nothing on the sender's side limits the rate),
sends blocking, and prints the number of records sent. Run it by path
(`FLOOD_SCRIPT`): a benchmark may run it under another checkout's Python.
"""

import json
import os
import socket
import sys
import time

from probe_client import wire

FLOOD_SCRIPT = os.path.abspath(__file__)


def main(path, seconds, token):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    hello = json.dumps({"run_token": token, "label": f"flood-{token}"}).encode()
    s.send(wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.DGRAM_HELLO, 0, 32, 0, 0, 0, 0) + hello)
    names = b"".join(
        wire.STRING_RECORD.pack(wire.REC_STRING, 0, i + 1, 0, n)
        for i, n in enumerate([b"step", b"recurrent"])
    )
    s.send(
        wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.DGRAM_RECORDS, 2, 32, 0, 0, 0, 0) + names
    )
    n = wire.MAX_RECORDS
    buf = bytearray(wire.HEADER_SIZE + n * 32)
    for i in range(n):
        wire.RECORD.pack_into(
            buf, 32 + i * 32, wire.REC_SPAN, 0, 1, os.getpid(), 1000 + i, 2000 + i, 2, 3
        )
    seq, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        wire.HEADER.pack_into(
            buf, 0, wire.MAGIC, wire.VERSION, wire.DGRAM_RECORDS, n, 32, seq, 0, 0, 0
        )
        s.send(buf)  # blocking: as fast as the daemon takes them
        seq += n
    s.close()
    print(seq)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
