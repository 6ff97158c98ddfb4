"""`stallscope demo`: a real daemon, the built-in serving engine, the report.

Starts `stallscope daemon` as a child process (demo/child.py) on a temporary
socket and database (or `--db`), runs the scenario engine in another child process with
a progress bar, stops the daemon with SIGTERM (it flushes and exits), and
prints the summary and the attribution report read from the database file.
"""

import os
import subprocess
import sys
import tempfile

import duckdb

from stallscope.analysis import report, summary
from stallscope.demo.child import DaemonChild


def run_demo(args):
    workdir = tempfile.mkdtemp(prefix="stallscope-demo-")
    db = os.path.abspath(args.db) if args.db else os.path.join(workdir, "demo.duckdb")
    sock = os.path.join(workdir, "probe.sock")
    out_dir = args.out or os.path.join(workdir, "report")
    log_path = os.path.join(workdir, "daemon.log")
    py = sys.executable
    print(f"stallscope demo: daemon on {sock}, database {db}", flush=True)
    backend = ["--sched-backend", args.sched_backend] if args.sched_backend else []
    daemon = DaemonChild(sock, db, log_path, backend)
    try:
        daemon.start()
        for line in daemon.read_log().splitlines():
            if (
                " probe: using " in line
                or " probe unavailable" in line
                or " probe: disabled" in line
            ):
                print("  " + line.split(" INFO ", 1)[-1].split(" WARNING ", 1)[-1].strip())
        print(
            f"running the serving-engine scenario for {args.duration:.0f} s "
            f"({args.rate:g} req/s; the seed's leaky timing hook "
            f"{'on' if args.gc_pressure else 'off'}; 1.7% of submits +3 ms host work)",
            flush=True,
        )
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        cmd = [
            py,
            "-m",
            "stallscope.demo.scenario",
            sock,
            "--duration",
            str(args.duration),
            "--rate",
            str(args.rate),
            "--progress",
            "--label",
            "demo",
            "--submit-jitter",
            "0.017:3",
        ]
        if args.gc_pressure:
            cmd.append("--gc-pressure")
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            print(f"warning: the scenario exited with status {rc}", file=sys.stderr)
    finally:
        status, _ = daemon.stop(timeout_s=10)
    if status != 0:
        print(f"warning: the daemon exited with status {status}; log: {log_path}", file=sys.stderr)

    con = duckdb.connect(db, read_only=True)
    try:
        print()
        print(summary.build_summary(con))
        print(report.build_report(con, out_dir=out_dir))
    finally:
        con.close()
    print(
        f"database: {db}\n"
        f"query it:  {py} -m stallscope.cli query step_attribution --db {db}\n"
        f'           (or `stallscope query "SELECT ..." --db {db}`)\n'
        f"daemon log: {log_path}"
    )
    return 0
