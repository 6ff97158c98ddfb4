"""The bcc sched probe's /proc verification, on a fake /proc and fake maps.

`verify()` compares each followed thread's switch-outs seen by the kernel
program (`state` n_vol/n_inv) with the kernel's own counts (/proc status)
and writes a deficit as a loss. It counts from the moment a process is
followed, not from its first pass (up to `sched_verify_ms` later): a switch
dropped in a process's first second is reported too. No root needed: the
maps and /proc are stand-ins, the probe's code is real."""

import types

from stallscope.probes.base import ProbeSettings
from stallscope.probes.sched_bcc import BccSchedProbe


class FakeMap:
    """A bcc table keyed by ctypes integers (compared by value)."""

    def __init__(self):
        self.items = {}

    def __setitem__(self, key, value):
        self.items[key.value] = value

    def __getitem__(self, key):
        return self.items[key.value]

    def get(self, key, default=None):
        return self.items.get(key.value, default)


class Sink:
    def __init__(self):
        self.losses = []

    def loss(self, probe, start_ns, end_ns, count, reason):
        self.losses.append((probe, count, reason))


def _status(root, pid, tid, vol, inv):
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "status").write_text(
        f"Name:\tpy\nvoluntary_ctxt_switches:\t{vol}\nnonvoluntary_ctxt_switches:\t{inv}\n"
    )


def _probe(tmp_path):
    probe = BccSchedProbe(ProbeSettings(proc_root=str(tmp_path)))
    maps = {b"tracked": FakeMap(), b"tid_tgid": FakeMap(), b"state": FakeMap()}
    probe._bpf = maps
    probe._sink = Sink()
    return probe, maps[b"state"]


def test_switches_dropped_before_the_first_pass_are_reported(tmp_path):
    pid = 4000
    # A thread that switched 100 + 5 times before it was followed, and a
    # second one the program meets only later.
    _status(tmp_path, pid, pid, 100, 5)
    _status(tmp_path, pid, pid + 1, 7, 0)
    probe, state = _probe(tmp_path)
    probe.track(pid)
    # Then: the kernel made 10 voluntary and 2 preempted switch-outs of the
    # first thread, the program saw 8 and 1; the second made 3 and saw 3.
    _status(tmp_path, pid, pid, 110, 7)
    state.items[pid] = types.SimpleNamespace(n_vol=8, n_inv=1)
    _status(tmp_path, pid, pid + 1, 10, 0)
    state.items[pid + 1] = types.SimpleNamespace(n_vol=3, n_inv=0)
    assert probe.verify() == 3
    assert sorted((n, r.split()[0]) for _, n, r in probe._sink.losses) == [
        (1, "preempted"),
        (2, "voluntary"),
    ]
    assert all(f"tid {pid} " in r for _, _, r in probe._sink.losses)
    # The next pass counts from this one: nothing new, nothing reported twice.
    assert probe.verify() == 0 and len(probe._sink.losses) == 2


def test_a_thread_that_switches_while_read_is_left_for_the_next_pass(tmp_path):
    pid = 4100
    _status(tmp_path, pid, pid, 50, 0)
    probe, state = _probe(tmp_path)

    class Moving(FakeMap):
        """The program sees a switch-out between the two reads of a pass."""

        def get(self, key, default=None):
            value = self.items.get(key.value, default)
            self.items[key.value] = types.SimpleNamespace(n_vol=(value.n_vol + 1), n_inv=0)
            return value

    moving = Moving()
    moving.items[pid] = types.SimpleNamespace(n_vol=0, n_inv=0)
    probe._bpf[b"state"] = moving
    probe.track(pid)
    assert probe._verify_base == {}  # no consistent reading: no base
