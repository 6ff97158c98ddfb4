"""`stallscope demo`: a real daemon, a serving engine, the report.

Starts `stallscope daemon` as a child process (demo/child.py) on a temporary
socket and database (or `--db`), runs the scenario engine in another child process with
a progress bar (or, with `--engine transformers`, HF transformers' real
continuous batching under `stallscope run --preset transformers`), stops the daemon with SIGTERM (it flushes and exits), and
prints the summary and the attribution report read from the database file.
The built-in engine runs with a heap census (the report names the top heap
growers and gives the GC advice); `--ab` runs it twice, as is and with
gc.freeze() after warm-up, and prints `compare --arm` of the two.
"""

import os
import signal
import subprocess
import sys
import tempfile

import duckdb

from stallscope.analysis import compare_arms, report, summary
from stallscope.demo.child import DaemonChild
from stallscope.errors import ServiceError


def _run_builtin(args, sock, label="demo", freeze_after_s=None):
    args.duration = 45.0 if args.duration is None else args.duration
    args.rate = 1.0 if args.rate is None else args.rate
    py = sys.executable
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
        label,
        "--submit-jitter",
        "0.017:3",
        "--census",
    ]
    if freeze_after_s is not None:
        print(f"  arm {label}: gc.collect() then gc.freeze() {freeze_after_s:g} s in", flush=True)
        cmd += ["--gc-freeze-after", str(freeze_after_s)]
    if args.gc_pressure:
        cmd.append("--gc-pressure")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        print(f"warning: the scenario exited with status {rc}", file=sys.stderr)


def _check_engines_extra():
    import importlib.util

    missing = [m for m in ("torch", "transformers", "psutil") if not importlib.util.find_spec(m)]
    if missing:
        raise ServiceError(
            f"the transformers demo needs the engines extra ({', '.join(missing)} missing): "
            "make demo DEMO_ENGINE=transformers, or pip install 'stallscope[engines]'"
        )


def _run_transformers(args, sock):
    """HF transformers' real continuous batching, traced with no source edit."""
    seconds = 20.0 if args.duration is None else args.duration
    rate = 8.0 if args.rate is None else args.rate
    engine = os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformers_engine.py")
    print(
        f"running HF transformers continuous batching (tiny random-weight Llama, torch CPU) "
        f"for {seconds:.0f} s at {rate:g} req/s, traced by `stallscope run --preset "
        f"transformers`; gen-2 pressure from another thread {'on' if args.gc_pressure else 'off'}",
        flush=True,
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "stallscope.cli", "run", "--socket", sock]
    cmd += ["--label", "demo-transformers", "--preset", "transformers", "--"]
    cmd += [sys.executable, engine, "--serve-seconds", str(seconds), "--rate", str(rate)]
    cmd += ["--max-new-tokens", "24"]
    if args.gc_pressure:
        cmd.append("--gc-pressure")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        print(f"warning: the transformers engine exited with status {rc}", file=sys.stderr)


def _run_vllm(args, sock):
    """vLLM's CPU build, multi-process, with worker GC passes inside and outside its steps."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ServiceError(
            "the vLLM demo needs the vllm extra (vLLM's CPU build): make demo DEMO_ENGINE=vllm, "
            "or STALLSCOPE_VLLM=1 make bootstrap"
        )
    engine = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_engine.py")
    print(
        "running vLLM's CPU build (engine core + worker process, random-weight Llama): 32 "
        "requests x 32 tokens, three rounds, with full GC passes forced in the worker inside "
        "and between its execute RPCs, traced by `stallscope run --preset vllm`",
        flush=True,
    )
    cmd = [sys.executable, "-m", "stallscope.cli", "run", "--socket", sock]
    cmd += ["--label", "demo-vllm", "--preset", "vllm", "--"]
    cmd += [sys.executable, engine, "--rounds", "3"]
    if args.gc_pressure:
        cmd += ["--gc-at-execute", "8,40,72", "--gc-while-idle", "20,52,84"]
    # its own session: vLLM's processes are killed with it if the demo is stopped
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        rc = proc.wait()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if rc != 0:
        print(f"warning: the vLLM engine exited with status {rc}", file=sys.stderr)


def run_demo(args):
    engine = getattr(args, "engine", "builtin")
    transformers = engine in ("transformers", "vllm")  # a real engine: no A/B arms
    if engine == "transformers":
        _check_engines_extra()
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
                or " probe: auto chose " in line  # the CPU sampler's clock, and why
                or " probe unavailable" in line
                or " probe: disabled" in line
            ):
                print("  " + line.split(" INFO ", 1)[-1].split(" WARNING ", 1)[-1].strip())
        if engine == "vllm":
            _run_vllm(args, sock)
        elif transformers:
            _run_transformers(args, sock)
        elif getattr(args, "ab", False):
            # The seed's offered patch, both ways: the engine as is, then with
            # gc.freeze() late in the scenario's warm-up (20% of the run, <= 10
            # s), so the freeze's own gc.collect() is not in the window.
            _run_builtin(args, sock, label="demo-asis")
            warmup_s = min(10.0, 0.2 * args.duration)
            _run_builtin(args, sock, "demo-freeze", round(0.75 * warmup_s, 3))
        else:
            _run_builtin(args, sock)
    finally:
        status, _ = daemon.stop(timeout_s=10)
    if status != 0:
        print(f"warning: the daemon exited with status {status}; log: {log_path}", file=sys.stderr)

    con = duckdb.connect(db, read_only=True)
    try:
        print()
        print(summary.build_summary(con))
        print(report.build_report(con, out_dir=out_dir))
        if getattr(args, "ab", False) and not transformers:
            print(compare_arms.compare_arms(con, [["demo-asis"], ["demo-freeze"]]))
    finally:
        con.close()
    print(
        f"database: {db}\n"
        f"query it:  {py} -m stallscope.cli query step_attribution --db {db}\n"
        f'           (or `stallscope query "SELECT ..." --db {db}`)\n'
        f"daemon log: {log_path}"
    )
    return 0
