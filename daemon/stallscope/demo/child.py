"""A `stallscope daemon` child process: start it, wait until it serves, stop it.

`stallscope demo` runs its daemon this way, and so do the benches and the
tests, which need a real daemon process on a socket and database of their
own. `preamble` is Python the child runs before the CLI (a module constant
set for one measurement, say). The child logs to a file; readiness is its
"listening on" line plus the socket file. It never touches the parent's
signal handlers; a child that exits early or is not ready in time raises
`ServiceError` with what it logged.
"""

import os
import signal
import subprocess
import sys
import time

from stallscope.errors import ServiceError

_CLI = "import sys\nfrom stallscope.cli import main\nsys.exit(main(sys.argv[1:]))\n"


class DaemonChild:
    """One daemon process: `socket`, `db` and `log` are paths; `args` are
    further `stallscope daemon` arguments."""

    def __init__(self, socket, db, log, args=(), preamble=None):
        self.socket = str(socket)
        self.db = str(db)
        self.log = str(log)
        self.args = list(args)
        self.preamble = preamble
        self.proc = None
        self.log_offset = 0
        self._logf = None

    def daemon_args(self):
        """The `stallscope daemon` arguments, read at each start."""
        return ["--socket", self.socket, "--db", self.db, *self.args]

    def command(self):
        if self.preamble:
            head = [sys.executable, "-c", self.preamble + "\n" + _CLI]
        else:
            head = [sys.executable, "-m", "stallscope.cli"]
        return [*head, "daemon", *self.daemon_args()]

    def start(self, wait=True, timeout_s=30):
        # The log is appended to across restarts: readiness and later checks
        # look only at what this start wrote.
        self.log_offset = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        self._logf = open(self.log, "a")
        self.proc = subprocess.Popen(self.command(), stdout=self._logf, stderr=self._logf)
        if wait:
            self.wait_ready(timeout_s)
        return self

    def read_log(self):
        """Everything the log file holds (every start)."""
        with open(self.log, errors="replace") as f:
            return f.read()

    def new_log(self):
        """What the daemon logged since its latest start."""
        with open(self.log, errors="replace") as f:
            f.seek(self.log_offset)
            return f.read()

    def wait_ready(self, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"the daemon exited early (status {self.proc.returncode}):\n{self.new_log()}"
                )
            if os.path.exists(self.socket) and "listening on" in self.new_log():
                return
            time.sleep(0.02)
        raise ServiceError(f"the daemon was not ready within {timeout_s:g} s:\n{self.new_log()}")

    def stop(self, timeout_s=10):
        """SIGTERM, then wait; returns (exit status, seconds it took). A child
        that outlives `timeout_s` is killed (status negative)."""
        if self.proc is None or self.proc.poll() is not None:
            return (self.proc.returncode if self.proc else None), 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._dump_stuck(time.monotonic() - t0)
            self.proc.kill()
            rc = self.proc.wait()
        self._logf.close()
        return rc, time.monotonic() - t0

    def _dump_stuck(self, waited_s):
        """A child that did not stop in time: its threads' kernel state into
        the log, then SIGUSR2, on which the daemon writes every thread's
        Python stack (faulthandler, from the signal itself: it needs no
        thread of the daemon to be scheduled), so the log says why."""
        lines = [f"--- not stopped {waited_s:.1f} s after SIGTERM; its threads:"]
        task = f"/proc/{self.proc.pid}/task"
        try:
            for tid in sorted(os.listdir(task), key=int):
                try:
                    with open(f"{task}/{tid}/stat") as f:
                        st = f.read()
                    with open(f"{task}/{tid}/wchan") as f:
                        wchan = f.read().strip()
                except OSError:
                    continue
                comm = st[st.index("(") + 1 : st.rindex(")")]
                fields = st[st.rindex(")") + 2 :].split()
                lines.append(
                    f"  {tid} {comm!r} state {fields[0]} nice {fields[16]} "
                    f"policy {fields[38]} cpu {fields[36]} wchan {wchan}"
                )
        except OSError as e:
            lines.append(f"  (cannot list {task}: {e})")
        self._logf.write("\n".join(lines) + "\n")
        self._logf.flush()
        try:
            self.proc.send_signal(signal.SIGUSR2)
            self.proc.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        print(self.new_log()[-20000:], file=sys.stderr)  # in the failing test's report

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self._logf.close()

    def query(self, sql, params=None):
        """Rows from the database file (the daemon must be stopped: it holds the file)."""
        import duckdb  # here: the probe client's tests import this module without it

        con = duckdb.connect(self.db, read_only=True)
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()

    def scalar(self, sql, params=None):
        return self.query(sql, params)[0][0]
