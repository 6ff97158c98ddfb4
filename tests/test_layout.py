"""The package layout's rules, checked on the source: imports run one way, as
the layer table in docs/architecture.md says (deferred imports included);
nothing in the product imports `testing/`; no folder grows past a dozen
modules; no import circles among stallscope modules; errors turned into exit
statuses only in `cli/`; the default paths written once."""

import ast
import re
import shutil
from pathlib import Path

import probe_client._probe
from stallscope.service import config

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "daemon" / "stallscope"
ARCHITECTURE = REPO / "docs" / "architecture.md"


def _modules(package=PACKAGE):
    """{dotted module name: path} for every stallscope module but generated code."""
    out = {}
    generated = package / "api" / "v1"
    for path in sorted(package.rglob("*.py")):
        if generated in path.parents:
            continue
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path, name, modules, module_level_only):
    """The stallscope modules `name` imports (at module level, or anywhere)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod when there is one.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def _cycle(graph):
    """One import circle as a list of module names, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _graph(module_level_only, package=PACKAGE):
    modules = _modules(package)
    return {
        name: _imports(path, name, modules, module_level_only) for name, path in modules.items()
    }


# ----- layers -------------------------------------------------------------------------
def layer_table(text=None):
    """{package: (layer or None for testing, {siblings it may import})}, read
    from the table between the `layers` markers of docs/architecture.md."""
    text = ARCHITECTURE.read_text() if text is None else text
    body = text.split("<!-- layers:", 1)[1].split("<!-- /layers -->", 1)[0]
    table = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        layer = None if cells[1] == "-" else int(cells[1])
        also = set(re.findall(r"`([a-z_]+)`", cells[2]))
        table[name] = (layer, also)
    return table


def _package_of(module):
    """`stallscope.store.database` -> 'store'; `stallscope.errors` -> 'errors';
    the package's own __init__ -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def layer_violations(package=PACKAGE, table=None):
    """Every import, deferred ones included, that the layer table does not allow."""
    table = layer_table() if table is None else table
    bad = []
    for name, targets in _graph(module_level_only=False, package=package).items():
        src = _package_of(name)
        if src is None:
            continue
        if src not in table:
            bad.append(f"{name}: package {src!r} has no row in the layer table")
            continue
        src_layer, also = table[src]
        for target in sorted(targets):
            dst = _package_of(target)
            if dst is None or dst == src:
                continue
            dst_layer, _ = table.get(dst, (None, set()))
            if dst == "testing":
                bad.append(f"{name} imports {target}: the product never imports testing/")
            elif dst not in table:
                bad.append(f"{name} imports {target}: package {dst!r} has no row")
            elif src_layer is None or dst in also:
                continue  # testing/ may use anything; a sibling the row names
            elif dst_layer is None or dst_layer >= src_layer:
                bad.append(
                    f"{name} (layer {src_layer}) imports {target} (layer {dst_layer}): "
                    "imports run down the layer table (docs/architecture.md)"
                )
    return bad


def test_the_layer_table_names_every_package():
    table = layer_table()
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    leaves = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert folders | leaves == set(table), "every folder and top-level module has one row"
    assert table["cli"][0] > table["service"][0] > table["store"][0] > table["vocab"][0]
    assert table["testing"][0] is None


def test_every_import_follows_the_layer_table():
    assert layer_violations() == []


def test_a_planted_upward_import_is_caught(tmp_path):
    """The check is not vacuous: the real tree with one upward import planted
    (the vocabulary reaching up into the service), one into testing/, and one
    sibling edge the table does not name."""
    tree = tmp_path / "stallscope"
    shutil.copytree(PACKAGE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    rules = tree / "vocab" / "rules.py"
    rules.write_text(
        rules.read_text() + "\n\ndef _up():\n    from stallscope.service import server\n"
    )
    fleet = tree / "probes" / "base.py"
    fleet.write_text(fleet.read_text() + "\nfrom stallscope.testing import fake_nvml  # noqa\n")
    ingest = tree / "ingest" / "census.py"
    ingest.write_text(ingest.read_text() + "\nfrom stallscope.store import database  # noqa\n")
    found = layer_violations(tree)
    assert len(found) == 3, found
    assert any(
        "stallscope.vocab.rules (layer 1) imports stallscope.service.server" in f for f in found
    )
    assert any("never imports testing" in f for f in found)
    assert any(
        f.startswith("stallscope.ingest.census (layer 2) imports stallscope.store") for f in found
    )


def test_no_folder_holds_more_than_a_dozen_modules():
    """probes/ stays flat (one file per probe and backend, like bcc's tools)."""
    crowded = {}
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]:
        if folder.name in ("probes", "__pycache__", "v1"):
            continue
        modules = [p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        if len(modules) > 12:
            crowded[str(folder.relative_to(PACKAGE))] = len(modules)
    assert crowded == {}


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles_at_module_level():
    graph = _graph(module_level_only=True)
    assert len(graph) > 40 and "stallscope.cli" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_no_import_circles_even_through_imports_inside_functions():
    # A deferred import that closes a circle still ties the two modules
    # together (access.py <-> api/client.py was one): none is left.
    graph = _graph(module_level_only=False)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_library_code_never_exits():
    """Only cli/ turns errors into exit statuses; a module's `__main__` block may."""
    offenders = []
    for name, path in _modules().items():
        if name.startswith("stallscope.cli"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        main_blocks = {
            id(n)
            for top in tree.body
            if isinstance(top, ast.If) and "__main__" in ast.unparse(top.test)
            for n in ast.walk(top)
        }
        for node in ast.walk(tree):
            if id(node) in main_blocks:
                continue
            text = ast.unparse(node) if isinstance(node, (ast.Raise, ast.Call)) else ""
            if isinstance(node, ast.Raise) and "SystemExit" in text:
                offenders.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.Call) and text.startswith("sys.exit("):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_default_paths_are_written_once():
    assert config.BY_DOTTED["daemon.socket"].default == config.DEFAULT_PROBE_SOCKET
    assert config.BY_DOTTED["daemon.db"].default == config.DEFAULT_DB
    # The probe client is stdlib-only and cannot import the daemon: its copy
    # of the probe socket path must agree.
    assert probe_client._probe.DEFAULT_SOCKET == config.DEFAULT_PROBE_SOCKET
    literal_paths = []
    for path in _modules().values():
        if path.name == "config_keys.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in (config.DEFAULT_PROBE_SOCKET, config.DEFAULT_DB):
                    literal_paths.append(f"{path.name}:{node.lineno}")
                if node.value in (config.DEFAULT_API_SOCKET, config.DEFAULT_CONFIG):
                    literal_paths.append(f"{path.name}:{node.lineno}")
    assert literal_paths == [], "write default paths in service/config_keys.py only"


def test_losses_and_probe_status_have_one_writer():
    """Only the store writes these two tables (Store.record_loss/record_losses/
    record_probe_status, and store/recovery.py's own losses while the disk
    refuses writes)."""
    owners = {"stallscope.store.database", "stallscope.store.recovery"}
    writers = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = " ".join(node.value.split()).lower()
                if "insert into losses" in text or "insert into probe_status" in text:
                    writers.append(f"{name}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "append"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in ("losses", "probe_status")
            ):
                writers.append(f"{name}:{node.lineno}")
    assert writers and all(w.split(":")[0] in owners for w in writers), writers


def test_loggers_are_named_by_module_or_by_a_documented_channel():
    """Every logger is `__name__` or `log_channel(__name__)`; each channel
    module exists and docs/systemd.md lists each channel."""
    from stallscope.vocab.log_channels import CHANNELS

    modules = _modules()
    hand_named = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "logging.getLogger":
                arg = ast.unparse(node.args[0]) if node.args else ""
                if arg not in ("__name__", "log_channel(__name__)"):
                    hand_named.append(f"{name}: getLogger({arg})")
                if arg == "log_channel(__name__)" and name not in CHANNELS:
                    hand_named.append(f"{name}: asks for a channel it has none of")
    assert hand_named == []
    assert set(CHANNELS) <= set(modules), set(CHANNELS) - set(modules)
    doc = (REPO / "docs" / "systemd.md").read_text().split("## Log channels", 1)[1]
    doc = doc.split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(stallscope[a-z_.]*)` \|", doc, re.M))
    assert set(CHANNELS.values()) == listed


def test_every_package_ships_in_the_wheel():
    """A folder with an __init__.py that pyproject.toml's `packages` does not
    name is missing from an installed daemon (scripts/install.sh installs
    the wheel, not the checkout): its imports would fail only there."""
    import tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(PACKAGE.parent).parts)
        for p in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found - listed == set(), (
        f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
    )
