"""Shared helpers for the fault suite: client processes, reconciliation, RSS."""

import json
import os
import subprocess
import sys

from helpers.daemonproc import DaemonProcess

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "clientproc.py")


def start_client(socket_path, rate, duration_s, label, ready=None):
    cmd = [sys.executable, CLIENT, socket_path, str(rate), str(duration_s), label]
    if ready:
        cmd += ["--ready", ready]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_client(proc, timeout_s=120):
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def reconcile(daemon, stats):
    """Per client: its run's stored records and reported losses, from the
    database (the daemon must be stopped), next to what the client made."""
    rows = []
    for st in stats:
        runs = daemon.query(
            "SELECT run_id, connections FROM runs WHERE client_token = ? AND pid = ?",
            [st["run_token"], st["pid"]],
        )
        assert len(runs) == 1, (st, runs)
        run_id, connections = runs[0]
        stored = daemon.scalar(
            "SELECT (SELECT count(*) FROM spans WHERE run_id = $1) + "
            "(SELECT count(*) FROM gc_events WHERE run_id = $1)",
            [run_id],
        )
        lost = daemon.scalar(
            "SELECT coalesce(sum(count), 0)::BIGINT FROM losses WHERE run_id = ?", [run_id]
        )
        dup = daemon.scalar(
            "SELECT count(*) - count(DISTINCT seq) FROM spans WHERE run_id = ?", [run_id]
        )
        rows.append(
            {
                "run_id": run_id,
                "made": st["next_seq"],
                "sent": st["sent_records"],
                "stored": stored,
                "lost": lost,
                "duplicates": dup,
                "connections": connections,
                "drops_full": st["drops_full"],
                "drops_disconnected": st["drops_disconnected"],
            }
        )
    return rows


def vm_hwm_kb(pid):
    """Peak resident set size of a process (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


class Daemon(DaemonProcess):
    """DaemonProcess with a database path of our choosing and, optionally,
    module constants set before the daemon starts (e.g. the store's bound):
    `patch` = {(module, name): value}."""

    def __init__(self, tmp_path, db=None, patch=None, **kw):
        preamble = "".join(
            f"setattr(importlib.import_module({mod!r}), {name!r}, {value!r})\n"
            for (mod, name), value in (patch or {}).items()
        )
        super().__init__(
            tmp_path, preamble="import importlib\n" + preamble if patch else None, **kw
        )
        if db:
            self.db = db
