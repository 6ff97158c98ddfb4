"""Coverage rows and diagnosis windows, on a real database and fake probes."""

import pytest

from stallscope.service import config
from stallscope.service.deep import MAX_WINDOW_S, DeepWindows
from stallscope.store.coverage import Coverage
from stallscope.store.database import Store


class FakeProbe:
    def __init__(self, name):
        self.name = name
        self.attached = False
        self.calls = []

    def attach(self):
        self.attached = True
        self.calls.append("attach")

    def detach(self):
        self.attached = False
        self.calls.append("detach")


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "c.duckdb"))
    yield s
    s.close()


def rows(store):
    store.flush()
    cur = store.cursor()
    try:
        return cur.execute(
            "SELECT run_id, probe, start_ns, end_ns FROM coverage ORDER BY run_id, probe, start_ns"
        ).fetchall()
    finally:
        cur.close()


def test_rows_follow_runs_and_windows(store):
    cov = Coverage(store)
    sc = FakeProbe("syscalls")
    deep = DeepWindows([sc, FakeProbe("sched")], cov)
    assert deep.probes == [sc] and not sc.attached
    cov.run_started(1, 100, ["sched", "page_faults"], now_ns=10)
    cov.run_started(1, 100, ["sched"], now_ns=11)  # a reconnect: still one open row
    until, names = deep.start(1.0)
    assert sc.attached and names == ["syscalls"]
    deep.tick(now_ns=until - 1)
    assert sc.attached
    cov.run_started(2, 200, ["sched", "syscalls"], now_ns=20)
    deep.tick(now_ns=until)
    assert not sc.attached and sc.calls == ["attach", "detach"]
    cov.run_ended(1, now_ns=30)
    cov.close_all(now_ns=40)
    got = rows(store)
    assert [(r, p, e) for r, p, _, e in got] == [
        (1, "page_faults", 30),
        (1, "sched", 30),
        (1, "syscalls", until),
        (2, "sched", 40),
        (2, "syscalls", until),
    ]
    assert [s for r, p, s, _ in got if p != "syscalls"] == [10, 10, 20]


def test_window_extends_and_deep_mode_stays(store):
    cov = Coverage(store)
    sc = FakeProbe("syscalls")
    deep = DeepWindows([sc], cov)
    u1, _ = deep.start(1.0)
    u2, _ = deep.start(5.0)
    assert u2 > u1 and sc.calls == ["attach"] and deep.windows == 1
    deep.start(10 * MAX_WINDOW_S)
    assert deep.until_ns - u2 <= MAX_WINDOW_S * 1e9
    with pytest.raises(ValueError):
        deep.start(0)
    always = DeepWindows([FakeProbe("syscalls")], cov, deep=True)
    assert always.probes[0].attached
    assert always.start(1.0) == (None, ["syscalls"])
    always.tick(now_ns=1 << 62)
    assert always.probes[0].attached
    with pytest.raises(RuntimeError, match="no expensive probe"):
        DeepWindows([], cov).start(1.0)


def test_deep_settings_parse():
    cfg = config.resolve({}, environ={})
    assert cfg["probes.deep"] is False and cfg["probes.kernel_causes"] is True
    assert cfg["probes.syscall_threshold_us"] == 50.0
    cfg = config.resolve({"deep": True, "syscall_threshold_us": 200.0}, environ={})
    assert cfg["probes.deep"] is True and cfg["probes.syscall_threshold_us"] == 200.0
    assert config.resolve({}, environ={"STALLSCOPE_DEEP": "yes"})["probes.deep"] is True
    with pytest.raises(config.ConfigError, match="probes.deep"):
        config.resolve({}, environ={"STALLSCOPE_DEEP": "maybe"})


def test_deep_in_a_file_must_be_a_boolean(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[probes]\ndeep = "yes"\n')
    with pytest.raises(config.ConfigError, match="probes.deep"):
        config.resolve({}, config_file=str(f), environ={})
    f.write_text("[probes]\ndeep = true\n")
    assert config.resolve({}, config_file=str(f), environ={})["probes.deep"] is True


class SlowTrackProbe:
    """A probe whose track() takes a while (the daemon's main loop starved on
    a busy CPU while it ran), covering from the moment it returns."""

    def __init__(self, name, track_s=0.0):
        self.name, self.track_s, self.returned_ns = name, track_s, None

    def track(self, pid):
        import time

        time.sleep(self.track_s)
        self.returned_ns = time.monotonic_ns()

    def covering(self):
        return True


def fake_daemon(store, probes, watcher_probe=None):
    """The Daemon attributes _track and track_external use, on a real store."""
    import types

    from stallscope.service.server import Daemon

    daemon = types.SimpleNamespace(
        tracked_pids=set(),
        probes=probes,
        coverage=Coverage(store),
        watcher=types.SimpleNamespace(probe=watcher_probe),
    )
    for name in ("_track", "_follow", "track_external"):
        setattr(daemon, name, types.MethodType(getattr(Daemon, name), daemon))
    return daemon


def test_each_probe_covers_a_new_run_from_its_own_track(store):
    """A run's coverage row for a probe opens when that probe follows the
    pid, not after every probe has: a slow track() of a later probe does not
    leave the earlier probe's first rows "not looked at"."""
    sched, slow = SlowTrackProbe("sched"), SlowTrackProbe("page_faults", track_s=0.3)
    fake_daemon(store, [sched, slow])._track(100, run_id=7)
    got = {p: s for r, p, s, _ in rows(store) if r == 7}
    assert set(got) == {"sched", "page_faults"}
    assert sched.returned_ns <= got["sched"] < sched.returned_ns + 100_000_000
    assert got["page_faults"] >= slow.returned_ns
    assert got["page_faults"] - got["sched"] >= 250_000_000


def test_a_watched_process_is_covered_per_probe_and_gc_from_when_it_was_followed(store):
    """`stallscope watch` (track_external): the same per-probe rows as a
    client's run, GC covering from `followed_ns`, the watcher's own probe
    not told to track (its track() means "a client took over")."""
    import time

    gc_probe = SlowTrackProbe("gc")
    sched, slow = SlowTrackProbe("sched"), SlowTrackProbe("page_faults", track_s=0.3)
    followed_ns = time.monotonic_ns() - 5_000_000_000
    daemon = fake_daemon(store, [gc_probe, sched, slow], watcher_probe=gc_probe)
    daemon.track_external(100, 9, followed_ns)
    got = {p: s for r, p, s, _ in rows(store) if r == 9}
    assert set(got) == {"gc", "sched", "page_faults"}
    assert got["gc"] == followed_ns
    assert gc_probe.returned_ns is None
    assert sched.returned_ns <= got["sched"] < sched.returned_ns + 100_000_000
    assert got["page_faults"] - got["sched"] >= 250_000_000
    assert daemon.tracked_pids == {100}
