"""A traced engine for the kernel-probe daemon tests: steps that make syscalls.

Usage: python kernel_client.py SOCKET STOPFILE. Connects a probe client,
then runs steps (each a `step` span around 200 getppid() calls and a first
touch of a few pages) until STOPFILE exists, prints its pid and native tid
as JSON first, and closes. Never asserts: the test judges.
"""

import json
import mmap
import os
import sys
import threading
import time

import probe_client


def main(socket_path, stop_file):
    probe = probe_client.connect(socket_path=socket_path, run_label="kernel", gc=False)
    print(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id()}), flush=True)
    while not os.path.exists(stop_file):
        t0 = probe.begin()
        for _ in range(200):
            os.getppid()
        m = mmap.mmap(-1, 16 * 4096)
        for i in range(16):
            m[i * 4096] = 1
        m.close()
        probe.end("step", t0, batch=1)
        time.sleep(0.005)
    probe.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
