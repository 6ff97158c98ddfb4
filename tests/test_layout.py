"""The package layout's rules, checked on the source: no import circles among
stallscope modules, errors turned into exit statuses only in `cli/`, and the
default paths written once."""

import ast
from pathlib import Path

import probe_client._probe
from stallscope.service import config

PACKAGE = Path(__file__).resolve().parents[1] / "daemon" / "stallscope"
GENERATED = PACKAGE / "api" / "v1"


def _modules():
    """{dotted module name: path} for every stallscope module but generated code."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
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


def _graph(module_level_only):
    modules = _modules()
    return {
        name: _imports(path, name, modules, module_level_only) for name, path in modules.items()
    }


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
    record_probe_status, and its own losses while the disk refuses writes)."""
    owners = {"store.py", "store_recovery.py"}
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
    assert writers and all(w.split(":")[0].rsplit(".", 1)[-1] + ".py" in owners for w in writers), (
        writers
    )
