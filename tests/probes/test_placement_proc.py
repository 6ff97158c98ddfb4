"""The placement probe on fixture /proc and /sys trees (SMT siblings busy
60 % against 4 %, two NUMA nodes, two hash seeds, a cgroup limit, cpufreq),
what `run_placement` and `stallscope compare` make of its rows, and the probe
on this machine's real /proc (no SMT, one node, no cpufreq: NULL with the
reasons)."""

import os
import threading
import time

import numpy as np

from helpers.sched import CollectSink
from helpers.schema_db import fresh_db
from stallscope.analysis.compare import compare_runs
from stallscope.analysis.compare_arms import compare_arms
from stallscope.analysis.compare_placement import (
    localized_frame,
    placement_differences,
    verdict_for,
)
from stallscope.analysis.report import build_report
from stallscope.probes.base import ProbeSettings
from stallscope.probes.placement_proc import (
    ProcPlacementProbe,
    Topology,
    parse_cpu_list,
    read_cpu_busy,
)
from stallscope.store import views

S = 1_000_000_000


def make_sys(root, smt=True, nodes=2, freq=True):
    for cpu in range(4):
        base = root / "devices" / "system" / "cpu" / f"cpu{cpu}"
        (base / "topology").mkdir(parents=True)
        pair = f"{cpu - cpu % 2}-{cpu - cpu % 2 + 1}" if smt else str(cpu)
        (base / "topology" / "thread_siblings_list").write_text(pair + "\n")
        if freq:
            (base / "cpufreq").mkdir()
            (base / "cpufreq" / "scaling_cur_freq").write_text(f"{3000000 - 600000 * (cpu // 2)}\n")
    for n in range(nodes):
        node = root / "devices" / "system" / "node" / f"node{n}"
        node.mkdir(parents=True)
        node.joinpath("cpulist").write_text("0-3\n" if nodes == 1 else f"{2 * n}-{2 * n + 1}\n")
    cg = root / "fs" / "cgroup" / "engine.slice"
    cg.mkdir(parents=True)
    (cg / "cpu.max").write_text("200000 100000\n")
    (cg / "cpuset.cpus.effective").write_text("0-3\n")


def write_stat(proc, busy):
    """busy: {cpu: busy ticks}; idle fills the rest."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{c} {b} 0 0 {100000 - b} 0 0 0 0 0 0" for c, b in sorted(busy.items())]
    (proc / "stat").write_text("\n".join(lines) + "\nintr 1\n")


def make_process(proc, pid, cpu, seed, mem_nodes, affinity="0-3"):
    base = proc / str(pid)
    (base / "task" / str(pid)).mkdir(parents=True)
    (base / "status").write_text(f"Name:\tengine\nCpus_allowed_list:\t{affinity}\n")
    (base / "cgroup").write_text("0::/engine.slice\n")
    env = b"PATH=/usr/bin\0" + (f"PYTHONHASHSEED={seed}\0".encode() if seed is not None else b"")
    (base / "environ").write_bytes(env)
    tokens = " ".join(f"N{n}={p}" for n, p in mem_nodes.items())
    (base / "numa_maps").write_text(
        f"7f0000000000 default anon=10 dirty=10 {tokens} kernelpagesize_kB=4\n"
    )
    set_thread(proc, pid, pid, 0, cpu)


def set_thread(proc, pid, tid, oncpu_ns, cpu):
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "schedstat").write_text(f"{oncpu_ns} 0 1\n")
    fields = ["S"] + ["0"] * 35 + [str(cpu)] + ["0"] * 10  # field 3 .. field 39 = processor
    (task / "stat").write_text(f"{tid} (engine x) " + " ".join(fields) + "\n")


def fixture_probe(tmp_path, **topo):
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    make_sys(sysfs, **topo)
    probe = ProcPlacementProbe(
        ProbeSettings(proc_root=str(proc), sys_root=str(sysfs), placement_window_s=100)
    )
    probe._sink = CollectSink()
    return probe, proc


def test_cpu_lists_and_topology(tmp_path):
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("") == []
    make_sys(tmp_path)
    topo = Topology(str(tmp_path))
    assert topo.siblings == {0: [1], 1: [0], 2: [3], 3: [2]}
    assert topo.node == {0: 0, 1: 0, 2: 1, 3: 1} and topo.numa and topo.smt
    assert topo.khz(2) == 2400000 and topo.reasons() == []


def two_engines(tmp_path):
    """Engine 100 on cpu0 (its sibling cpu1 busy 60 %), seed 0, memory on node 0;
    engine 200 on cpu2 (node 1; sibling cpu3 busy 4 %), random seed, memory
    on node 0: remote."""
    probe, proc = fixture_probe(tmp_path)
    tick = probe.tick_ns
    per_s = S // tick  # ticks per second per CPU
    write_stat(proc, {0: 0, 1: 0, 2: 0, 3: 0})
    make_process(proc, 100, 0, 0, {0: 900, 1: 100})
    make_process(proc, 200, 2, None, {0: 950, 1: 50})
    probe.poll(now_ns=10 * S)
    probe.track(100)
    probe.track(200)
    probe.settle()
    for i in (1, 2):
        write_stat(
            proc, {0: i * per_s, 1: i * per_s * 60 // 100, 2: i * per_s, 3: i * per_s * 4 // 100}
        )
        set_thread(proc, 100, 100, i * 900_000_000, 0)
        set_thread(proc, 200, 200, i * 900_000_000, 2)
        probe.poll(now_ns=(10 + i) * S)
    probe.untrack(100)
    probe.untrack(200)
    probe.settle()
    return probe


def test_sibling_busy_numa_seed_and_limits_from_fixtures(tmp_path):
    sink = two_engines(tmp_path)._sink
    cpu = sink.table("placement_cpu")
    by_pid = {int(p): i for i, p in enumerate(cpu["pid"])}
    assert sorted(by_pid) == [100, 200] and len(cpu["pid"]) == 2  # one CPU each
    a, b = by_pid[100], by_pid[200]
    assert cpu["cpu"][a] == 0 and cpu["cpu"][b] == 2
    # the first poll after tracking is the base: two intervals of 0.9 s on CPU
    assert cpu["oncpu_ns"][a] == 1_800_000_000 == cpu["oncpu_ns"][b]
    assert abs(cpu["sibling_busy_ns"][a] / cpu["oncpu_ns"][a] - 0.60) < 0.01
    assert abs(cpu["sibling_busy_ns"][b] / cpu["oncpu_ns"][b] - 0.04) < 0.01
    assert list(cpu["node"]) == [0, 1] and list(cpu["khz"]) == [3000000, 2400000]
    place = sink.table("placement")
    assert list(place["pid"]) == [100, 200]  # nothing changed after tracking
    assert list(place["hash_seed"]) == ["0", "random"]
    assert list(place["mem_node"]) == [0, 0] and place["mem_nodes"][1] == "N0=950,N1=50"
    assert list(place["cgroup_cpus"]) == [2.0, 2.0] and place["cgroup"][0] == "/engine.slice"
    assert list(place["affinity"]) == ["0-3", "0-3"] and list(place["affinity_cpus"]) == [4, 4]
    assert place["reasons"][0] is None  # every field readable on this fixture


def test_a_change_of_affinity_is_a_new_row(tmp_path):
    probe, proc = fixture_probe(tmp_path)
    write_stat(proc, {0: 0, 1: 0, 2: 0, 3: 0})
    make_process(proc, 100, 0, 0, {0: 10})
    probe.track(100)
    probe.poll(now_ns=11 * S)  # applies the track first
    (proc / "100" / "status").write_text("Cpus_allowed_list:\t1\n")
    probe._pids[100].cgroup_at = -1e18  # due now
    probe.poll(now_ns=12 * S)
    place = probe._sink.table("placement")
    assert list(place["affinity"]) == ["0-3", "1"] and list(place["ts_ns"])[1] == 12 * S


def test_no_smt_one_node_no_cpufreq_are_null_with_reasons(tmp_path):
    probe, proc = fixture_probe(tmp_path, smt=False, nodes=1, freq=False)
    write_stat(proc, {0: 0, 1: 0, 2: 0, 3: 0})
    make_process(proc, 100, 1, "random", {0: 10})
    (proc / "100" / "environ").chmod(0)
    probe.track(100)
    probe.settle()
    write_stat(proc, {0: 50, 1: 50, 2: 50, 3: 50})
    set_thread(proc, 100, 100, 500_000_000, 1)
    probe.poll(now_ns=11 * S)
    probe.untrack(100)
    probe.settle()
    cpu = probe._sink.table("placement_cpu")
    assert cpu["sibling_busy_ns"][0] is None and cpu["khz"][0] is None and cpu["node"][0] == 0
    place = probe._sink.table("placement")
    reasons = place["reasons"][0]
    assert "no SMT" in reasons and "one NUMA node" in reasons and "no cpufreq" in reasons
    assert place["mem_node"][0] is None  # one node: numa_maps is not read
    if os.geteuid() != 0:  # root reads a mode-0 file anyway
        assert "hash seed unknown" in reasons and place["hash_seed"][0] is None


def _insert(con, table, cols):
    names = list(cols)
    rows = list(
        zip(
            *[[v.item() if isinstance(v, np.generic) else v for v in cols[n]] for n in names],
            strict=True,
        )
    )
    con.executemany(
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})", rows
    )


def test_compare_names_each_placement_difference(tmp_path):
    sink = two_engines(tmp_path)._sink
    con = fresh_db()
    for table in ("placement", "placement_cpu"):
        _insert(con, table, sink.table(table))
    for run, pid, scale in ((1, 100, 1.0), (2, 200, 1.05)):
        con.execute(
            "INSERT INTO runs (run_id, pid, tid, label, connected_ns) VALUES (?, ?, ?, ?, ?)",
            [run, pid, pid, f"engine-{pid}", 10 * S],
        )
        for i in range(60):  # 10 ms steps (B 5 % slower), a little jitter
            t0 = 10 * S + i * 20_000_000
            dur = round(scale * (10_000_000 + 30_000 * (i % 7)))
            con.execute(
                "INSERT INTO spans (run_id, tid, kind, stage, batch, start_ns, end_ns, depth, seq) "
                "VALUES (?, ?, 'step', 'decode', 4, ?, ?, 0, ?)",
                [run, pid, t0, t0 + dur, i],
            )
    assert views.create_views(con) == []
    rows = con.execute(
        "SELECT run_id, main_cpu, sibling_busy_pct, cpu_node, mem_node, numa_remote, hash_seed, "
        "clock_mhz, cgroup_cpus FROM run_placement ORDER BY run_id"
    ).fetchall()
    assert rows == [
        (1, 0, 60.0, 0, 0, False, "0", 3000, 2.0),
        (2, 2, 4.0, 1, 0, True, "random", 2400, 2.0),
    ]
    text = compare_runs(con, 1, 2)
    assert "SMT sibling busy while on CPU: A 60.0%, B 4.0%" in text
    assert "hash seed (PYTHONHASHSEED): A 0, B random" in text
    assert "NUMA: B's memory is on node 0 (N0=950,N1=50), its main CPU on node 1 (remote)" in text
    assert "CPU clock: A 3000 MHz, B 2400 MHz" in text
    verdicts = text.split("== Per-step time: placement or code ==")[1]
    line = next(ln for ln in verdicts.splitlines() if ln.startswith("decode"))
    assert "1.05" in line and "no CPU profile of both runs" in line  # 5 %, outside the interval
    arms = compare_arms(con, [[1], [2]]).split("== Placement per run ==")[1].splitlines()
    (a,) = [ln for ln in arms if ln.split()[:2] == ["A", "1"]]
    (b,) = [ln for ln in arms if ln.split()[:2] == ["B", "2"]]
    assert "cpu0 100%" in a and "60.0" in a and "cpu2 100%" in b and "random" in b
    report = build_report(con).split("== Generation-2")[0]  # the run table and its placement
    (row,) = [ln for ln in report.splitlines() if "cpu0 100%" in ln]
    assert row.split()[:3] == ["1", "cpu0", "100%"] and "60.0" in row and "3000" in row


def test_remote_memory_is_named():
    base = {"main_cpu": 0, "main_cpu_pct": 99.0, "sibling_busy_pct": None, "cpu_node": 0,
            "mem_node": 0, "mem_nodes": "N0=9", "numa_remote": False, "hash_seed": "0",
            "clock_mhz": None, "affinity": "0-3", "cgroup_cpus": None}  # fmt: skip
    remote = dict(base, mem_node=1, mem_nodes="N0=1,N1=9", numa_remote=True)
    (line,) = placement_differences(base, remote)
    assert line == "NUMA: B's memory is on node 1 (N0=1,N1=9), its main CPU on node 0 (remote)"
    assert placement_differences(base, dict(base)) == []
    assert "did not cover" in placement_differences(base, None)[0]


def test_real_proc_follows_a_busy_thread():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    sink = CollectSink()
    probe = ProcPlacementProbe(ProbeSettings(placement_poll_ms=50, placement_window_s=0.5))
    assert ProcPlacementProbe.unavailable(ProbeSettings()) is None
    assert read_cpu_busy() and probe.topo.siblings
    probe.start(sink)
    t0 = time.thread_time_ns()
    probe.track(os.getpid())
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not sink.table("placement_cpu"):
            time.sleep(0.05)
    finally:
        stop.set()
        probe.untrack(os.getpid())
        probe.stop()
    assert t0 >= 0 and not probe.covering()
    cpu = sink.table("placement_cpu")
    assert cpu and (cpu["oncpu_ns"] > 0).all() and (cpu["end_ns"] > cpu["start_ns"]).all()
    assert set(cpu["cpu"].tolist()) <= set(os.sched_getaffinity(0))
    place = sink.table("placement")
    assert place["pid"][0] == os.getpid() and place["affinity_cpus"][0] == len(
        os.sched_getaffinity(0)
    )
    assert (
        place["hash_seed"][0] == os.environ.get("PYTHONHASHSEED", "random")
        or place["hash_seed"][0] == "random"
    )


def test_verdicts_tell_code_from_placement_and_host_time():
    ms = 1_000_000
    # the slower run spends 4 ms more per step: 3.5 of it on CPU, in no frame
    assert verdict_for(4 * ms, 3.5 * ms, 0, None, None, "B").startswith("uniform: B's +3.500 ms")
    v = verdict_for(4 * ms, 3.5 * ms, 0, "walk (engine.py:3)", 3 * ms, "B")
    assert v.startswith("localized: walk (engine.py:3) holds 3.000 ms")
    # 1 ms on CPU, 2.5 ms seen off CPU (preempted, blocked, ...): the causes say which
    assert verdict_for(4 * ms, 1 * ms, 2.5 * ms, None, None, "A").startswith("off CPU: of A's")
    # 1 ms on CPU and nothing seen off CPU: host time the guest cannot see
    assert verdict_for(4 * ms, 1 * ms, 0.2 * ms, None, None, "A").startswith("unseen: of A's")


def test_a_frame_holding_the_excess_is_found_and_a_spread_one_is_not():
    # fast run: 1,000 samples over 100 steps, 80 % in work, 20 % in schedule
    fast = ({1: (1000, 0, "main"), 2: (800, 1, "work"), 3: (200, 1, "schedule")}, 1000, 100)
    # slower run, localized: 400 more samples, all in schedule
    slow = ({1: (1400, 0, "main"), 2: (800, 1, "work"), 3: (600, 1, "schedule")}, 1400, 100,
            1_000_000)  # fmt: skip
    frame, local, excess = localized_frame(fast, slow, 4.265)
    assert frame == "schedule" and excess == 4_000_000 and local > 0.5 * excess
    # slower run, uniform: every frame 40 % more
    slow = ({1: (1400, 0, "main"), 2: (1120, 1, "work"), 3: (280, 1, "schedule")}, 1400, 100,
            1_000_000)  # fmt: skip
    assert localized_frame(fast, slow, 4.265)[0] is None
