"""Every setting is a declared key: each ProbeSettings field is a [probes]
key with its default, doc, flag and environment variable, and every setting
a message tells operators to change exists."""

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from stallscope import cli
from stallscope.demo import scenario
from stallscope.probes.base import ProbeSettings
from stallscope.service import config

PACKAGE = Path(__file__).resolve().parents[1] / "daemon" / "stallscope"


def test_every_probe_setting_is_a_declared_key():
    defaults = ProbeSettings()
    for f in fields(ProbeSettings):
        key = config.BY_DOTTED.get(f"probes.{f.name}")
        assert key is not None, f"ProbeSettings.{f.name} has a type no config key can hold"
        assert key.doc, f"ProbeSettings.{f.name}: declare it with _key(default, doc)"
        default = getattr(defaults, f.name)
        assert key.default == (list(default) if isinstance(default, tuple) else default)
        assert key.env and key.flag


def test_every_key_becomes_a_setting_and_back():
    env = {"STALLSCOPE_SCHED_RING_PAGES": "64", "STALLSCOPE_GPU_BUFFERS": "no"}
    cfg = config.resolve({"sched_verify_ms": 250.0, "gpus": [1]}, None, env)
    settings = config.probe_settings(cfg)
    assert settings.sched_ring_pages == 64 and settings.gpu_buffers is False
    assert settings.sched_verify_ms == 250.0 and settings.gpus == (1,)
    assert config.probe_settings(config.resolve({}, None, {})) == ProbeSettings()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[probes]\nsched_ring_pages = 1.5\n", "sched_ring_pages: expected an integer"),
        ('[probes]\ngpu_buffers = "off"\n', "gpu_buffers: expected true or false"),
        ("[probes]\nsched_max_tids = 0\n", "sched_max_tids: 0 is below the minimum 1"),
    ],
)
def test_probe_keys_are_checked_like_the_others(tmp_path, text, expected):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match=expected):
        config.resolve({}, str(path), {})


def _messages():
    """(module, line, text) of every string constant in the package's code
    but docstrings (which name modules such as api.alerts)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "v1" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) not in docstrings:
                    yield path.name, node.lineno, node.value


# "raise sched_ring_pages", "lower probes.sched_poll_ms", "set api.tls_cert".
_TELLS = re.compile(
    r"\b(?:raise|lower|increase|decrease|set)\s+(?:the\s+)?([a-z]+(?:[._][a-z0-9]+)+)"
)
_DOTTED = re.compile(r"(?<![\w.])((?:daemon|probes|retention|api|metrics)\.[a-z][a-z0-9_]*)\b")
_FILE_SUFFIXES = (".sock", ".log", ".py", ".toml", ".duckdb", ".sql")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")


def _options():
    """Every option of the `stallscope` commands and of the demo's engine."""
    parser = cli.build_parser()
    seen = set(parser._option_string_actions) | set(scenario.build_parser()._option_string_actions)
    for action in parser._subparsers._group_actions:
        for sub in action.choices.values():
            seen |= set(sub._option_string_actions)
    return seen


def _request_fields():
    """Fields of the API's requests: a message may tell a client to set one."""
    from stallscope.api.v1 import stallscope_pb2 as pb

    return {
        f.name
        for m in pb.DESCRIPTOR.message_types_by_name.values()
        if m.name.endswith("Request")
        for f in m.fields
    }


def test_every_setting_a_message_names_exists():
    names = {k.name for k in config.KEYS} | set(config.BY_DOTTED) | _request_fields()
    options = _options()
    unknown = []
    for module, line, text in _messages():
        if " " not in text:
            continue  # an argv word or a name, not a message
        for name in _TELLS.findall(text):
            if name not in names:
                unknown.append(f"{module}:{line}: {name}")
        for name in _DOTTED.findall(text):
            if name not in config.BY_DOTTED and not name.endswith(_FILE_SUFFIXES):
                unknown.append(f"{module}:{line}: {name}")
        for flag in _FLAG.findall(text):
            if flag not in options:
                unknown.append(f"{module}:{line}: {flag}")
    assert unknown == [], "\n".join(unknown)


def test_the_scan_would_catch_an_undeclared_name():
    assert _TELLS.findall("ring full (raise sched_ring_bytes or lower sched_poll_ms)") == [
        "sched_ring_bytes",
        "sched_poll_ms",
    ]
    assert "sched_ring_bytes" not in {k.name for k in config.KEYS}
    assert "--sched-ring-bytes" not in _options() and "--sched-ring-pages" in _options()


def test_the_docs_list_every_key():
    table = (Path(__file__).resolve().parents[1] / "docs" / "systemd.md").read_text()
    assert [k.dotted for k in config.KEYS if f"| {k.dotted} |" not in table] == []
