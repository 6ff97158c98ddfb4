"""Retention on real DuckDB files: whole old runs go with their rows, kernel and
GPU rows older than the oldest kept run go, connected runs stay, the used size
ends under the limit; and a running daemon trims a database that is too big."""

import shutil
import time

import numpy as np
import pytest

from helpers.systemd import ServiceProcess
from stallscope.store.database import Store
from stallscope.store.retention import SIZE_TARGET_FRACTION, Limits, Retention, used_bytes
from stallscope.store.retention import _tables as r_tables

pytestmark = pytest.mark.daemon

# One DuckDB row group per run: space comes back a row group at a time.
SPANS_PER_RUN = 122_880
DAY_NS = 86_400 * 10**9


def fill(store, runs, now_rt, now_mono, connected=()):
    """`runs` ended runs one hour apart (run 1 oldest), spans and GC rows for
    each, and kernel/GPU rows covering the whole period."""
    hour = 3600 * 10**9
    for run_id in range(1, runs + 1):
        start = now_mono - (runs - run_id + 1) * hour
        ended = None if run_id in connected else start + hour // 2
        store.sql(
            "INSERT INTO runs (run_id, pid, label, started_ns, realtime_ns, connected_ns, "
            "ended_ns) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                run_id,
                1000 + run_id,
                f"run{run_id}",
                start,
                now_rt - (runs - run_id + 1) * hour,
                start,
                ended,
            ],
        )
        ts = start + np.arange(SPANS_PER_RUN, dtype=np.int64) * 1000
        rng = np.random.default_rng(run_id)
        store.append(
            "spans",
            {
                "run_id": np.full(SPANS_PER_RUN, run_id, dtype=np.int64),
                "tid": rng.integers(1, 1 << 20, SPANS_PER_RUN),
                "kind": ["step"] * SPANS_PER_RUN,
                "start_ns": ts,
                "end_ns": ts + rng.integers(1, 10**7, SPANS_PER_RUN),
            },
        )
        store.append(
            "gc_events",
            {
                "run_id": np.full(10, run_id, dtype=np.int64),
                "generation": np.full(10, 2, dtype=np.int8),
                "start_ns": ts[:10],
                "end_ns": ts[:10] + 5,
            },
        )
        store.append(
            "offcpu",
            {
                "pid": np.full(1000, 1000 + run_id, dtype=np.int32),
                "tid": np.full(1000, 1, dtype=np.int32),
                "start_ns": ts[:1000],
                "end_ns": ts[:1000] + 100,
            },
        )
        store.append("nvml_samples", {"gpu": np.zeros(100, dtype=np.int32), "ts_ns": ts[:100]})
        store.flush()
    store.con.execute("CHECKPOINT")


def halfway_mb(tmp_path, full_bytes):
    """A limit halfway between an empty database (schema, views) and `full_bytes`."""
    empty = Store(str(tmp_path / "empty.duckdb"))
    empty.con.execute("CHECKPOINT")
    cur = empty.cursor()
    base = used_bytes(cur, empty.path)
    cur.close()
    empty.close()
    return (base + (full_bytes - base) / 2) / 2**20


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "r.duckdb"))
    yield s
    s.close()


def test_size_limit_deletes_oldest_ended_runs_and_their_rows(store, tmp_path):
    now_rt, now_mono = time.time_ns(), time.monotonic_ns() + 100 * 3600 * 10**9
    fill(store, runs=8, now_rt=now_rt, now_mono=now_mono, connected={1})
    cur = store.cursor()
    # Retention trims to SIZE_TARGET_FRACTION of the limit: put that target
    # halfway between an empty and the full database, so about half the runs
    # must go (space comes back in whole blocks, so not exactly half).
    limit_mb = halfway_mb(tmp_path, used_bytes(cur, store.path)) / SIZE_TARGET_FRACTION
    ret = Retention(store, Limits(max_db_mb=limit_mb, max_age_days=0))
    done = ret.check(now_rt, now_mono)
    assert done["after_bytes"] <= limit_mb * 2**20 < done["before_bytes"]
    kept = [r[0] for r in cur.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    deleted = sorted(done["runs_deleted"])
    # Oldest first, never the connected run 1, newest kept.
    assert 1 in kept and 8 in kept
    assert deleted == list(range(2, 2 + len(deleted))) and deleted
    for table in ("spans", "gc_events"):
        left = {r[0] for r in cur.execute(f"SELECT DISTINCT run_id FROM {table}").fetchall()}
        assert left == set(kept), table
    assert cur.execute("SELECT count(*) FROM spans").fetchone()[0] == SPANS_PER_RUN * len(kept)
    # Kernel and GPU rows older than the oldest kept run (run 1, connected) stay;
    # with run 1 kept, nothing in them is older than it.
    assert cur.execute("SELECT count(*) FROM offcpu").fetchone()[0] == 8000
    cur.close()


def test_kernel_rows_follow_the_oldest_kept_run(store, tmp_path):
    now_rt, now_mono = time.time_ns(), time.monotonic_ns() + 100 * 3600 * 10**9
    fill(store, runs=6, now_rt=now_rt, now_mono=now_mono)
    cur = store.cursor()
    limit_mb = halfway_mb(tmp_path, used_bytes(cur, store.path))
    done = Retention(store, Limits(max_db_mb=limit_mb)).check(now_rt, now_mono)
    oldest_kept = cur.execute("SELECT min(connected_ns) FROM runs").fetchone()[0]
    assert done["runs_deleted"]
    for table, col in (("offcpu", "end_ns"), ("nvml_samples", "ts_ns")):
        assert (
            cur.execute(f"SELECT count(*) FROM {table} WHERE {col} < ?", [oldest_kept]).fetchone()[
                0
            ]
            == 0
        ), table
        assert cur.execute(f"SELECT count(*) FROM {table}").fetchone()[0] > 0, table
    cur.close()


def test_age_limit_by_wall_clock(store):
    now_rt, now_mono = time.time_ns(), time.monotonic_ns() + 100 * 3600 * 10**9
    fill(store, runs=5, now_rt=now_rt, now_mono=now_mono)
    cur = store.cursor()
    # 2.5 hours: runs 1-3 started 5, 4, 3 hours ago; runs 4 and 5 stay.
    done = Retention(store, Limits(max_db_mb=0, max_age_days=2.5 / 24)).check(now_rt, now_mono)
    assert sorted(done["runs_deleted"]) == [1, 2, 3]
    assert cur.execute("SELECT DISTINCT run_id FROM spans ORDER BY 1").fetchall() == [(4,), (5,)]
    cutoff = now_mono - int(2.5 * 3600 * 10**9)
    assert cur.execute("SELECT count(*) FROM offcpu WHERE end_ns < ?", [cutoff]).fetchone()[0] == 0
    cur.close()


def test_cpu_stacks_and_frames_go_once_no_sample_names_them(store):
    """cpu_samples are trimmed by time like kernel rows; a stack goes once no
    sample names it and it is older than two id epochs, a frame once no stack
    names it (younger ones may still be named by the sampler's caches)."""
    from stallscope.vocab.schema import CPU_STACK_EPOCH_NS

    now_rt, now_mono = time.time_ns(), time.monotonic_ns() + 100 * 3600 * 10**9
    old = now_mono - 5 * 3600 * 10**9  # older than the 2.5 h age limit
    young = now_mono - CPU_STACK_EPOCH_NS // 2  # inside the sampler's current epoch
    store.append(
        "cpu_frames",
        {
            "frame_id": [1, 2, 3, 4],
            "kind": ["py", "py", "native", "py"],
            "function": ["old_only", "shared", "leaf", "young_unused"],
            "first_ts_ns": [old, old, old, young],
        },
    )
    # stack 10: old samples only; 11: old and new samples; 12: no sample, young
    store.append(
        "cpu_stacks",
        {
            "stack_id": [10, 10, 11, 11, 12],
            "depth": [0, 1, 0, 1, 0],
            "frame_id": [3, 1, 3, 2, 4],
            "first_ts_ns": [old, old, old, old, young],
        },
    )
    store.append(
        "cpu_samples",
        {
            "pid": [7, 7, 7, 7],
            "tid": [7, 7, 7, 7],
            "ts_ns": [old, old + 1, old + 2, now_mono - 10**9],
            "stack_id": [10, 10, 11, 11],
        },
    )
    store.flush()
    done = Retention(store, Limits(max_db_mb=0, max_age_days=2.5 / 24)).check(now_rt, now_mono)
    cur = store.cursor()
    assert cur.execute("SELECT count(*) FROM cpu_samples").fetchone()[0] == 1
    stacks = {r[0] for r in cur.execute("SELECT stack_id FROM cpu_stacks").fetchall()}
    frames = {r[0] for r in cur.execute("SELECT function FROM cpu_frames").fetchall()}
    cur.close()
    assert stacks == {11, 12}
    assert frames == {"shared", "leaf", "young_unused"}
    assert done["rows_deleted"] == 3 + 2 + 1  # samples, stack 10's rows, frame old_only


def test_no_limits_deletes_nothing(store):
    now_rt, now_mono = time.time_ns(), time.monotonic_ns()
    fill(store, runs=2, now_rt=now_rt - 400 * DAY_NS, now_mono=now_mono)
    done = Retention(store, Limits(0, 0)).check()
    assert done["runs_deleted"] == [] and done["rows_deleted"] == 0


def used_after_deleting(db, tmp_path, runs):
    """The used size of a copy of `db` with its k oldest runs deleted, for k
    = 0..runs (the same deletions and checkpoint the daemon's retention does)."""
    sizes = []
    for k in range(runs + 1):
        copy = tmp_path / f"dry{k}.duckdb"
        shutil.copyfile(db, copy)
        s = Store(str(copy))
        r = Retention(s, Limits(max_db_mb=0, max_age_days=0))
        cur = s.cursor()
        run_tables, _ = r_tables(cur)
        done = {"runs_deleted": [], "rows_deleted": 0}
        r._delete_runs(cur, list(range(1, k + 1)), run_tables, done)
        r._checkpoint(cur, done)
        sizes.append(used_bytes(cur, s.path))
        cur.close()
        s.close()
    return sizes


def test_running_daemon_trims_an_oversized_database(tmp_path):
    svc = ServiceProcess(
        tmp_path,
        '[probes]\nsched_backend = "none"\ngpu_backend = "none"\n'
        "[retention]\nmax_age_days = 0\ncheck_interval_s = 1\n",
    )
    s = Store(svc.db)
    now_rt, now_mono = time.time_ns(), time.monotonic_ns()
    fill(s, runs=6, now_rt=now_rt, now_mono=now_mono)
    s.close()
    # Space comes back a row group at a time (~0.5-1 MiB here), and the
    # daemon adds rows of its own (probe_status, coverage, daemon_stats) and
    # WAL: a target put by formula near one of those steps was sometimes
    # below what one kept run needs (every run went). So the steps are
    # measured on copies (used size with the k oldest runs deleted) and the
    # trim target is put halfway between keeping four runs and keeping three:
    # the daemon, with its own rows and WAL (measured: up to one step more,
    # ~0.75 MiB), then keeps one to three runs, never none and never all.
    steps = used_after_deleting(svc.db, tmp_path, 6)
    assert steps[2] - steps[3] > 2**18, steps  # a step of more than 256 KiB to aim into
    target = (steps[2] + steps[3]) / 2
    limit_mb = round(target / SIZE_TARGET_FRACTION / 2**20, 3)
    svc.args += ["--max-db-mb", str(limit_mb)]
    svc.start()
    try:
        svc.wait_log("retention (max_db_mb=")
        assert svc.stop() == 0
    finally:
        svc.kill()
    runs = [r[0] for r in svc.query("SELECT run_id FROM runs ORDER BY run_id")]
    print(f"used MiB with 0..6 oldest runs deleted: {[round(u / 2**20, 2) for u in steps]}; "
          f"target {target / 2**20:.2f} MiB; kept {runs}")  # fmt: skip
    assert runs and runs[0] > 1 and runs[-1] == 6
    used, block = svc.query(
        "SELECT used_blocks * block_size, block_size FROM pragma_database_size()"
    )[0]
    # What the daemon writes after the check (its own rows: probe_status and
    # coverage of every probe, daemon_stats; checkpointed at stop) can take
    # up to two more blocks than the check saw (block-granular, as freed
    # space is; one block was enough before the CPU and CUDA probes' rows:
    # 25 blocks against 23.9 + 1 then).
    assert used <= limit_mb * 2**20 + 2 * block
