"""A real `stallscope daemon` child process for a test, in its tmp_path."""

from stallscope.demo.child import DaemonChild


class DaemonProcess(DaemonChild):
    """Socket, database and log in `tmp_path`; no GPU probe; the scheduling
    backend `sched_backend` ("none" unless given); no CPU sampler unless
    `extra_args` holds --cpu-sampler (it needs root and takes ~3 s to load);
    `extra_args` appended."""

    def __init__(self, tmp_path, sched_backend="none", extra_args=(), preamble=None):
        super().__init__(
            tmp_path / "probe.sock",
            tmp_path / "test.duckdb",
            tmp_path / "daemon.log",
            preamble=preamble,
        )
        self.dir = tmp_path
        self.sched_backend = sched_backend
        self.extra_args = list(extra_args)

    def daemon_args(self):
        args = ["--socket", self.socket, "--db", self.db, "--gpu-backend", "none"]
        if self.sched_backend:
            args += ["--sched-backend", self.sched_backend]
        if self.sched_backend == "none" and "--kernel-causes" not in self.extra_args:
            # no kernel probes at all unless a test asks (they need root and
            # take ~1 s to load)
            args += ["--no-kernel-causes"]
        if "--cpu-sampler" not in self.extra_args:
            args += ["--no-cpu-sampler"]
        return args + self.extra_args
