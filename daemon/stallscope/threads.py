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
- `paced(name, backlog)`: work that must keep pace with the engine (the
  probe socket: a client's socket must not fill). Where the daemon may
  raise a thread again (`can_raise()`), it runs at idle priority while its
  backlog gauge says it keeps up and under SCHED_BATCH at nice 0 while it
  does not (the main loop's gauge says so too while no client is
  connected); elsewhere it is a batch thread throughout. A batch thread gets
  a full share of a CPU but, once it has run a tick, the kernel's fair
  share preempts a busy engine thread for it: on two busy CPUs that was
  the daemon's last preemptor of the engine (tests/store/test_observer.py).
  Threads that say nothing (DuckDB's, Arrow's, gRPC's) are moved to idle
  priority by `sweep()`, which the main loop calls.

A background thread that falls behind (a ring more than half full, a
store backlog over half its bound) is raised to normal priority until it
has caught up: it registers a `backlog` gauge (the fraction of its bound in
use), and the paced main loop, which always runs, calls `check_backlogs()`
to `boost()` a thread whose gauge passes one half and `unboost()` it below
one quarter. When raising is not permitted (no CAP_SYS_NICE and no
LimitNICE= in the unit) it is said once and counted, and the bound still
holds (work past it is dropped as a known loss). `BackgroundPool` runs
calls (the API's queries and exports) on background threads for callers
that must stay at normal priority. `place(cpus)` keeps every daemon thread
off the CPUs the traced engines run on while another CPU is allowed.
Nothing here blocks the caller beyond the call it asked for; failures are
returned reasons, never exceptions into the caller's loop.
"""

import logging
import os
import queue
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from stallscope.vocab.log_channels import log_channel

SCHED_IDLE = getattr(os, "SCHED_IDLE", 5)
SCHED_OTHER = getattr(os, "SCHED_OTHER", 0)
SCHED_BATCH = getattr(os, "SCHED_BATCH", 3)
BACKGROUND, PACED, SERVING = "background", "paced", "serving"
# A serving thread's nice: 0, a fair share like the user's own commands (at
# nice 10 a query still waited 2 s median on a host at load 7).
SERVING_NICE = 0
POLICY_NAMES = {SCHED_OTHER: "other", SCHED_IDLE: "idle", SCHED_BATCH: "batch"}
BOOST_REFUSED = (
    "cannot raise a background thread back to normal priority (needs CAP_SYS_NICE, "
    "or LimitNICE=+0 in the unit): a thread that falls behind stays at idle priority "
    "and its bound drops what does not fit (losses 'daemon_backlog')"
)

BOOST_ABOVE, UNBOOST_BELOW = 0.5, 0.25  # backlog fractions
# A backlog over this wakes its thread (background(hurry=...)) at the next
# check (the main loop's tick: 0.1 s apart while clients send, 0.5 s while
# none does): a ring reader that sleeps up to 1 s between small reads is
# read again well before its ring could fill.
HURRY_ABOVE = 0.05
_CAP_SYS_NICE = 23
# A paced thread waiting this long for a CPU per wake-up, on average, counts
# as a full backlog (raised above half: 10 ms; lowered below 5 ms). Idle
# priority waited 1.4 ms median, 185 ms p99 on two CPUs at load 8; batch
# 2 ms and 37 ms.
WAIT_FULL_MS = 20
WAIT_WINDOW_S = 0.5
WAIT_HOLD_S = 10
# check_backlogs() forgets threads that ended at most this often.
PRUNE_EVERY_S = 1.0
log = logging.getLogger(log_channel(__name__))

_lock = threading.Lock()
_threads = {}  # tid -> {"name", "role", "boosted", "backlog"}
# Every tid this process's threads had (registered or seen by sweep()), kept
# after they end: the scheduling probe names a daemon thread that preempted
# a traced one by its tid, and resolves the pid when it drains, possibly
# after that thread ended (its /proc entry gone). Bounded: tids are reused.
_own_tids = set()
OWN_TIDS_MAX = 4096
_state = {
    "cpus": None,
    "initial": None,  # the daemon's own allowed CPUs, before place() narrowed them
    "boosts": 0,
    "boost_refused": 0,
    "refused_reason": None,
    "dodge": True,  # dodge_step_threads() moves threads (daemon.keep_off_engine_cpus)
}
# pid -> tids of the traced threads that emit spans (their engine's steps):
# dodge_step_threads() keeps a burst of background work off their CPUs.
_step_tids = {}
# Step threads read per dodge: beyond this many, the first ones only (each
# costs a /proc read, ~15 us).
DODGE_MAX_THREADS = 16


def _tid():
    return threading.get_native_id()


def _remember(tids):
    """Note tids as this process's threads (caller holds _lock)."""
    if len(_own_tids) >= OWN_TIDS_MAX:
        _own_tids.clear()
    _own_tids.update(tids)


def was_own_thread(tid):
    """True when `tid` is, or was, a thread of this daemon (one that
    registered a role, or that sweep() saw): an ended daemon thread is still
    the daemon's when a probe resolves who it preempted."""
    with _lock:
        return tid in _own_tids


def background(name, backlog=None, hurry=None):
    """Make the calling thread a background thread (SCHED_IDLE); `backlog()`,
    if given, returns the fraction of its bound in use (see check_backlogs);
    `hurry()`, if given, wakes the thread early, and is called whenever its
    backlog is over HURRY_ABOVE (a ring reader may then sleep long while
    little comes). Returns None, or the reason it stays at normal priority."""
    tid = _tid()
    with _lock:
        _remember((tid,))
        _threads[tid] = {
            "name": name,
            "role": BACKGROUND,
            "boosted": False,
            "backlog": backlog,
            "hurry": hurry,
        }
    try:
        os.sched_setscheduler(0, SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as exc:
        return f"{name}: cannot run at idle priority: {exc}"
    return _apply_cpus(tid)


def serving(name):
    """Make the calling thread one that answers a waiting user (the API's
    queries and status, a metrics scrape): SCHED_BATCH at nice SERVING_NICE.
    At idle priority a request waited seconds on a host whose CPUs nice-0
    work fills (bench/query_under_hog.py); as a batch thread it never
    preempts on waking and, while it runs, takes a fair share of a CPU, as
    the user's own command would: the engine pays at most the request's CPU
    time, only while it runs. Returns None, or the reason it stays as it was
    (leaving idle priority needs what boost() needs)."""
    return serve_tid(_tid(), name)


def serve_tid(tid, name):
    """serving() for thread `tid` of this process (a library's server thread;
    the threads it starts inherit the policy)."""
    with _lock:
        _remember((tid,))
        _threads[tid] = {"name": name, "role": SERVING, "boosted": False, "backlog": None}
    try:
        os.setpriority(os.PRIO_PROCESS, tid, SERVING_NICE)
        os.sched_setscheduler(tid, SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError) as exc:
        return f"{name}: stays as it was, not a batch thread at nice {SERVING_NICE}: {exc}"
    return _apply_cpus(tid)


def can_raise():
    """Whether this process may move a thread from idle priority back to nice
    0 (the kernel asks for CAP_SYS_NICE or an RLIMIT_NICE of at least 20,
    which is what the unit's LimitNICE=+0 sets), without trying it."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
        if soft == resource.RLIM_INFINITY or soft >= 20:
            return True
        with open("/proc/self/status") as f:
            caps = next(ln for ln in f if ln.startswith("CapEff:"))
        return bool(int(caps.split()[1], 16) & (1 << _CAP_SYS_NICE))
    except (OSError, ValueError, StopIteration, AttributeError):
        return False


def paced(name, backlog=None):
    """Make the calling thread one that keeps pace: at idle priority while
    `backlog()` (the fraction of what it can fall behind by, as for
    background threads) says it keeps up, raised to SCHED_BATCH at nice 0
    by `check_backlogs()`/`check_paced()` while it does not; a batch thread
    throughout when there is no gauge or raising is not permitted (it could
    not come back). Returns None, or the reason it stays as it was."""
    tid = _tid()
    idle_until_behind = backlog is not None and can_raise()
    gauge = None
    if idle_until_behind:
        waits = _WaitShare(tid)
        gauge = lambda: max(backlog(), waits.level())  # noqa: E731
    with _lock:
        _remember((tid,))
        _threads[tid] = {
            "name": name,
            "role": PACED,
            "boosted": False,
            "backlog": gauge,
            "raise_to": SCHED_BATCH,
        }
    policy = SCHED_IDLE if idle_until_behind else SCHED_BATCH
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except (OSError, AttributeError) as exc:
        return f"{name}: cannot run as a {POLICY_NAMES[policy]} thread: {exc}"
    return _apply_cpus(tid)


class _WaitShare:
    """How long a thread waits for a CPU each time it wakes (runnable, not
    running: /proc/self/task/TID/schedstat), as a gauge level: at idle
    priority a reader gets a CPU at once while the CPUs have time to spare,
    and waits up to hundreds of milliseconds while nice-0 work fills them
    all (a CPU hog), when it must be a batch thread again to keep pace. The
    mean wait per wake-up over windows of at least WAIT_WINDOW_S, against
    WAIT_FULL_MS; once it was high, the level stays in the band between
    lowering and raising for WAIT_HOLD_S, so that a thread raised because
    the CPUs are full does not drop back each time raising helped. An
    unreadable schedstat reads as contended."""

    def __init__(self, tid):
        self.path = f"/proc/self/task/{tid}/schedstat"
        self.last = None  # (wall ns, wait ns, time slices)
        self.value = 1.0
        self.hold_until = 0

    def level(self):
        now = time.monotonic_ns()
        # the file is read once per window (the main loop asks ~10 times a second)
        if self.last is None or now - self.last[0] >= WAIT_WINDOW_S * 1e9:
            try:
                with open(self.path) as f:
                    _, wait, slices = (int(x) for x in f.read().split()[:3])
            except (OSError, ValueError):
                return 1.0
            if self.last is None:
                self.last = (now, wait, slices)
                return self.value
            woke = slices - self.last[2]
            per_wake = (wait - self.last[1]) / woke if woke > 0 else 0.0
            self.value = per_wake / (WAIT_FULL_MS * 1e6)
            self.last = (now, wait, slices)
            if self.value > BOOST_ABOVE:
                self.hold_until = now + int(WAIT_HOLD_S * 1e9)
        if now < self.hold_until:
            return max(self.value, (BOOST_ABOVE + UNBOOST_BELOW) / 2)
        return self.value


def check_paced():
    """check_backlogs() for the calling paced thread alone: cheap enough for
    every round of the main loop, so a burst raises it at once instead of at
    the next housekeeping tick."""
    tid = _tid()
    with _lock:
        info = _threads.get(tid)
    if info is None or info["backlog"] is None:
        return
    _check(tid, info)


def boost(tid=None):
    """Raise a background thread (the caller by default) to normal priority
    while it catches up; True when it runs at normal priority now."""
    tid = tid or _tid()
    with _lock:
        info = _threads.get(tid)
        if info is None or info["backlog"] is None and info["role"] != BACKGROUND:
            return False
        if info["boosted"]:
            return True
    try:
        os.sched_setscheduler(tid, info.get("raise_to", SCHED_OTHER), os.sched_param(0))
    except ProcessLookupError:
        return False  # it ended (check_backlogs forgets it within PRUNE_EVERY_S)
    except OSError:
        with _lock:
            _state["boost_refused"] += 1
            _state["refused_reason"] = BOOST_REFUSED
        return False
    with _lock:
        info["boosted"] = True
        _state["boosts"] += 1
    return True


def keep_up():
    """A background thread's own look at its backlog gauge (the one it
    registered with `background()`), each time it wakes: past BOOST_ABOVE it
    raises itself now rather than at the main loop's next check_backlogs(),
    which is late when the CPUs are full (the main loop itself runs at idle
    priority while its clients send slowly: with a CPU hog on every CPU the
    CPU sampler's 8 MiB ring was 99 % full before it was raised). Lowering
    stays with check_backlogs(). True when the thread runs raised."""
    tid = _tid()
    with _lock:
        info = _threads.get(tid)
        if info is None or info["backlog"] is None:
            return False
        if info["boosted"]:
            return True
    level = _level(info)
    if level <= BOOST_ABOVE:
        return False
    if boost(tid):
        name, share = info["name"], 100 * level
        log.info("%s fell behind (%.0f%% of its bound): raised to normal priority", name, share)
        return True
    return False


def boost_all():
    """Raise every registered thread that can be raised (stopping: systemd's
    stop timeout and clients' tails bound it, and a writer or an export at
    idle priority on busy CPUs would not finish in time), and every thread
    `sweep()` moved to idle priority: the process cannot exit before each
    of its threads has run once more to die, and on busy CPUs an idle-priority
    thread waits seconds for that (DuckDB's jemalloc background thread held
    the exit 1.5-7 s after a 0.1 s shutdown with two CPU hogs here). Returns
    how many run raised now."""
    alive = set(_task_ids())
    with _lock:
        tids = [t for t, info in _threads.items() if t in alive and not info["boosted"]]
        known = set(_threads)
    raised = sum(boost(tid) for tid in tids)
    for tid in alive - known:
        try:
            if os.sched_getscheduler(tid) == SCHED_IDLE:
                os.sched_setscheduler(tid, SCHED_OTHER, os.sched_param(0))
                raised += 1
        except OSError:
            continue
    return raised


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


def boost_refused():
    """True once raising a thread was refused (then it will be again)."""
    with _lock:
        return _state["boost_refused"] > 0


def check_backlogs():
    """Boost background threads whose backlog passed BOOST_ABOVE, unboost those
    back under UNBOOST_BELOW; called by a thread that always runs (the paced
    main loop). Returns the names boosted now."""
    now = time.monotonic()
    alive = None
    if now >= _state.get("next_prune", 0.0):  # ended threads are few: once a second
        _state["next_prune"] = now + PRUNE_EVERY_S
        alive = set(_task_ids())
    with _lock:
        if alive is not None:
            for tid in [t for t in _threads if t not in alive]:
                del _threads[tid]  # a thread that ended (a probe stopped)
        items = [(tid, info) for tid, info in _threads.items() if info["backlog"] is not None]
    boosted = []
    for tid, info in items:
        if _check(tid, info):
            boosted.append(info["name"])
    return boosted


def _level(info):
    """A registered thread's backlog gauge now; a gauge whose object went
    away (a probe stopping) reads as no backlog."""
    try:
        return float(info["backlog"]())
    except Exception:
        return 0.0


def _check(tid, info):
    """Raise or lower one thread by its gauge; True when raised now."""
    level = _level(info)
    hurry = info.get("hurry")
    if hurry is not None and level > HURRY_ABOVE:
        try:
            hurry()
        except Exception:
            pass
    # The paced reader goes up and down with its clients' traffic, often:
    # its moves are debug lines (counted in snapshot()'s boosts).
    say = log.debug if info["role"] == PACED else log.info
    if level > BOOST_ABOVE and not info["boosted"]:
        if boost(tid):
            say(
                "%s fell behind (%.0f%% of its bound): raised to %s priority",
                info["name"],
                100 * level,
                "batch" if info.get("raise_to") == SCHED_BATCH else "normal",
            )
            return True
        if _state["boost_refused"] == 1:
            log.warning("%s fell behind: %s", info["name"], BOOST_REFUSED)
    elif level < UNBOOST_BELOW and info["boosted"]:
        unboost(tid)
        say("%s caught up: back to idle priority", info["name"])
    return False


def sweep(keep=()):
    """Every thread of the daemon that registered no role (DuckDB's, Arrow's,
    gRPC's own threads, a helper thread a library started) goes to idle
    priority; only the main thread and the threads registered as paced stay
    normal. Returns how many were moved now."""
    main = os.getpid()
    tids = _task_ids()
    with _lock:
        known = dict(_threads)
        _remember(tids)
    moved = 0
    for tid in tids:
        info = known.get(tid)
        if tid == main or tid in keep or (info and info["role"] in (PACED, SERVING)):
            continue
        if info and info["boosted"]:
            continue
        try:
            if os.sched_getscheduler(tid) != SCHED_IDLE:
                os.sched_setscheduler(tid, SCHED_IDLE, os.sched_param(0))
                moved += 1
        except OSError:
            continue
    return moved


def forget():
    """The calling thread is about to end."""
    with _lock:
        _threads.pop(_tid(), None)


def note_step_threads(pid, tids):
    """Threads of `pid` that emit spans (ingest learns them from its records)."""
    with _lock:
        _step_tids.setdefault(int(pid), set()).update(int(t) for t in tids)


def forget_step_threads(pid):
    with _lock:
        _step_tids.pop(int(pid), None)


def set_dodging(enabled):
    with _lock:
        _state["dodge"] = bool(enabled)


def step_thread_cpus(proc_root="/proc"):
    """The CPUs the traced step threads last ran on (/proc/PID/task/TID/stat,
    field 39); a thread gone is forgotten."""
    with _lock:
        pairs = [(p, t) for p, tids in _step_tids.items() for t in tids][:DODGE_MAX_THREADS]
    cpus, gone = set(), []
    for pid, tid in pairs:
        try:
            with open(f"{proc_root}/{pid}/task/{tid}/stat", "rb") as f:
                text = f.read()
        except OSError:
            gone.append((pid, tid))
            continue
        # the fields after the comm's closing parenthesis start at field 3
        fields = text[text.rindex(b")") + 2 :].split()
        try:
            cpus.add(int(fields[39 - 3]))
        except (IndexError, ValueError):
            continue
    if gone:
        with _lock:
            for pid, tid in gone:
                _step_tids.get(pid, set()).discard(tid)
    return cpus


def dodge_step_threads(proc_root="/proc"):
    """Before a burst of background work (a store flush) or a wait (a ring
    reader's): keep the calling thread off the CPUs the traced step threads
    last ran on, while another CPU of the daemon's is left. On CPUs a busy
    engine fills, an idle-priority thread queued on a step thread's CPU is
    picked over it once its slice is used (EEVDF), several times in a flush
    of a few ms; queued elsewhere, it takes its turn from a thread that is
    not the step's. The affinity stays through the thread's sleep, so its
    next wake-up lands there too. With no step thread (or dodging off) a
    thread this narrowed gets the daemon's CPUs back; others are left alone.
    Returns the CPUs the thread may use now, or None where it did nothing."""
    with _lock:
        enabled, placed, stepping = _state["dodge"], _state["cpus"], bool(_step_tids)
    base = set(placed) if placed else allowed()
    local = _dodged.__dict__
    if not (enabled and stepping):
        if not local.get("narrowed"):
            return None
        target = base
    else:
        target = (base - step_thread_cpus(proc_root)) or base
    try:
        # read back each time: place() moves every thread of the daemon
        if os.sched_getaffinity(0) != target:
            os.sched_setaffinity(0, target)
    except OSError:
        return None
    local["narrowed"] = target != base
    return target


_dodged = threading.local()  # per thread: whether dodge_step_threads narrowed it


def _apply_cpus(tid):
    cpus = _state["cpus"]
    if not cpus:
        return None
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError as exc:
        return f"cannot place thread {tid} on CPUs {sorted(cpus)}: {exc}"
    return None


def allowed():
    """The CPUs the daemon itself may use (its affinity when first asked: the
    unit's CPUAffinity= and the cgroup's set), whatever place() did since."""
    with _lock:
        if _state["initial"] is None:
            _state["initial"] = set(os.sched_getaffinity(0))
        return set(_state["initial"])


def place(cpus):
    """Keep every thread of the daemon (the registered ones and those it does
    not know: DuckDB's, gRPC's) on `cpus` (within `allowed()`); None or
    empty = all of `allowed()`. Returns the reasons of threads that could
    not be moved."""
    base = allowed()
    chosen = (set(cpus) & base) if cpus else None
    with _lock:
        _state["cpus"] = chosen or None
    target = chosen or base
    problems = []
    for tid in _task_ids():
        try:
            os.sched_setaffinity(tid, target)
        except OSError as exc:
            problems.append(f"thread {tid}: {exc}")
    return problems


def parse_cpu_list(text):
    """'0-2,5' -> {0, 1, 2, 5} (the kernel's CPU list format)."""
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


class BackgroundPool:
    """Calls run on `workers` background threads (SCHED_IDLE from birth), for
    callers that must stay at normal priority themselves (a gRPC handler
    thread that also serves live streams)."""

    def __init__(self, name, workers, role=BACKGROUND):
        self._pool = ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix=name,
            initializer=serving if role == SERVING else background,
            initargs=(name,),
        )

    def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on a background thread; its result or exception."""
        return self._pool.submit(fn, *args, **kwargs).result()

    def iterate(self, make_iterator, depth=2):
        """Yield what `make_iterator()` yields, produced on a background thread
        (at most `depth` items ahead); its exception is raised here. Closing
        the returned generator stops the producer at its next item."""
        items = queue.Queue(maxsize=depth)
        stop = threading.Event()
        done = object()

        def produce():
            try:
                for item in make_iterator():
                    while not stop.is_set():
                        try:
                            items.put(("item", item), timeout=0.25)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                items.put(("end", done))
            except BaseException as exc:  # handed to the consumer, raised there
                items.put(("error", exc))

        future = self._pool.submit(produce)
        try:
            while True:
                kind, value = items.get()
                if kind == "item":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            stop.set()
            while not future.done():
                try:
                    items.get(timeout=0.05)  # unblock a producer waiting to put
                except queue.Empty:
                    pass

    def shutdown(self):
        self._pool.shutdown(wait=False, cancel_futures=True)
