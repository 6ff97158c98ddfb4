"""Priority and placement of the daemon's own threads: the traced engine wins.

A tracer must not be the noise it measures, so every thread of the daemon
says which of two roles it has, first thing when it starts:

- `background(name)`: work that can wait (the store writer, the step fill,
  retention, exports, the kernel ring readers, the stall detector). The
  thread runs under SCHED_IDLE: a normal thread waking on its CPU preempts
  it at once, it never preempts a normal thread on waking (the kernel's
  wake-up path skips idle and batch tasks), a waking normal thread prefers
  a CPU that runs only idle tasks, and it weighs 3 against a nice-0 task's
  1,024 when both want one CPU. SCHED_BATCH at nice 19 also never preempts
  on waking, but weighs 15 and is not treated as an idle CPU by the waking
  engine, so SCHED_IDLE is the stronger of the two.
- `paced(name)`: work that must keep pace with the engine (the probe
  socket: a client's socket must not fill); it stays at normal priority
  and is kept cheap.

A background thread that falls behind (a ring more than half full, a
store backlog over half its bound) is raised to normal priority with
`boost()` until it has caught up (`unboost()`); when that is not permitted
(no CAP_SYS_NICE and no LimitNICE= in the unit), it is said once and
counted, and the bound still holds (work past it is dropped as a known
loss). `place(cpus)` keeps every daemon thread off the CPUs the traced
engines run on while another CPU is allowed. Nothing here blocks; every
failure is a returned reason, never an exception into the caller's loop.
"""

import os
import threading

SCHED_IDLE = getattr(os, "SCHED_IDLE", 5)
SCHED_OTHER = getattr(os, "SCHED_OTHER", 0)
BACKGROUND, PACED = "background", "paced"
POLICY_NAMES = {SCHED_OTHER: "other", SCHED_IDLE: "idle", getattr(os, "SCHED_BATCH", 3): "batch"}
BOOST_REFUSED = (
    "cannot raise a background thread back to normal priority (needs CAP_SYS_NICE, "
    "or LimitNICE=+0 in the unit): a thread that falls behind stays at idle priority "
    "and its bound drops what does not fit (losses 'daemon_backlog')"
)

_lock = threading.Lock()
_threads = {}  # tid -> {"name", "role", "boosted"}
_state = {"cpus": None, "boosts": 0, "boost_refused": 0, "refused_reason": None}


def _tid():
    return threading.get_native_id()


def background(name):
    """Make the calling thread a background thread (SCHED_IDLE); returns None,
    or the reason it stays at normal priority."""
    tid = _tid()
    with _lock:
        _threads[tid] = {"name": name, "role": BACKGROUND, "boosted": False}
    try:
        os.sched_setscheduler(0, SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as exc:
        return f"{name}: cannot run at idle priority: {exc}"
    return _apply_cpus(tid)


def paced(name):
    """Register the calling thread as one that keeps pace at normal priority."""
    tid = _tid()
    with _lock:
        _threads[tid] = {"name": name, "role": PACED, "boosted": False}
    return _apply_cpus(tid)


def boost(tid=None):
    """Raise a background thread (the caller by default) to normal priority
    while it catches up; True when it runs at normal priority now."""
    tid = tid or _tid()
    with _lock:
        info = _threads.get(tid)
        if info is None or info["role"] != BACKGROUND or info["boosted"]:
            return bool(info and info["boosted"])
    try:
        os.sched_setscheduler(tid, SCHED_OTHER, os.sched_param(0))
    except OSError:
        with _lock:
            _state["boost_refused"] += 1
            _state["refused_reason"] = BOOST_REFUSED
        return False
    with _lock:
        info["boosted"] = True
        _state["boosts"] += 1
    return True


def unboost(tid=None):
    """Back to idle priority after `boost()`."""
    tid = tid or _tid()
    with _lock:
        info = _threads.get(tid)
        if info is None or not info["boosted"]:
            return
        info["boosted"] = False
    try:
        os.sched_setscheduler(tid, SCHED_IDLE, os.sched_param(0))
    except OSError:
        pass


def forget():
    """The calling thread is about to end."""
    with _lock:
        _threads.pop(_tid(), None)


def _apply_cpus(tid):
    cpus = _state["cpus"]
    if not cpus:
        return None
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError as exc:
        return f"cannot place thread {tid} on CPUs {sorted(cpus)}: {exc}"
    return None


def place(cpus):
    """Keep every thread of the daemon (the registered ones and those it does
    not know: DuckDB's, gRPC's) on `cpus`; None or empty = anywhere allowed.
    Returns the reasons of threads that could not be moved."""
    with _lock:
        _state["cpus"] = set(cpus) if cpus else None
    target = _state["cpus"] or os.sched_getaffinity(0) | _allowed_cpus()
    problems = []
    for tid in _task_ids():
        try:
            os.sched_setaffinity(tid, target)
        except OSError as exc:
            problems.append(f"thread {tid}: {exc}")
    return problems


def _allowed_cpus():
    """Every CPU this process may run on (its cgroup's and the unit's set)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return _parse_list(line.split(":", 1)[1])
    except OSError:
        pass
    return set(range(os.cpu_count() or 1))


def _parse_list(text):
    out = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _task_ids():
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [_tid()]


def snapshot():
    """{tid: (name, role, policy name, boosted)} of the registered threads
    alive now, plus the counters: what `stallscope status` and the tests read."""
    with _lock:
        threads = dict(_threads)
        state = dict(_state)
    alive = set(_task_ids())
    out = {}
    for tid, info in threads.items():
        if tid not in alive:
            continue
        try:
            policy = POLICY_NAMES.get(os.sched_getscheduler(tid), "?")
        except OSError:
            continue
        out[tid] = (info["name"], info["role"], policy, info["boosted"])
    return {
        "threads": out,
        "boosts": state["boosts"],
        "boost_refused": state["boost_refused"],
        "refused_reason": state["refused_reason"],
        "cpus": sorted(state["cpus"]) if state["cpus"] else None,
    }
