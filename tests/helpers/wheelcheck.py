"""Checks attach targets against an engine's real source, read from its wheel with `ast`.

For each spec: the module file exists in the wheel, the class path and the
method are defined there (or in a base class the module imports from the
same wheel), every argN a keyword's EXPR uses is a parameter of the method,
and the first attribute an EXPR reads from `self`, `result` or `argN` is
one the class (or the annotated parameter / return type) defines: as a
class-level annotation or assignment, a `self.X = ...` in any method, a
method or a property. Attributes further down a chain are followed while
annotations say what they are. Nothing is imported or executed.
"""

import ast
import zipfile


class Source:
    """The Python files of one wheel, parsed on demand."""

    def __init__(self, wheel_path):
        self.zip = zipfile.ZipFile(wheel_path)
        self.names = set(self.zip.namelist())
        self._trees = {}

    def module(self, dotted):
        """(path, ast.Module) of a module, or None when the wheel lacks it."""
        base = dotted.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in self.names:
                if path not in self._trees:
                    self._trees[path] = ast.parse(self.zip.read(path), filename=path)
                return path, self._trees[path]
        return None


class ClassInfo:
    def __init__(self, source, module, node):
        self.source = source
        self.module = module
        self.node = node

    def members(self):
        """name -> annotation node (or None) of everything the class defines."""
        out = {}
        for stmt in self.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out[stmt.target.id] = stmt.annotation
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        out.setdefault(target.id, None)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                is_property = any(
                    _name(d) in ("property", "cached_property") for d in stmt.decorator_list
                )
                out.setdefault(stmt.name, stmt.returns if is_property else None)
                for node in ast.walk(stmt):
                    targets = []
                    if isinstance(node, ast.Assign):
                        targets = node.targets
                    elif isinstance(node, ast.AnnAssign):
                        targets = [node.target]
                    for target in targets:
                        if (
                            isinstance(target, ast.Attribute)
                            and isinstance(target.value, ast.Name)
                            and target.value.id == "self"
                        ):
                            ann = node.annotation if isinstance(node, ast.AnnAssign) else None
                            if ann is not None or target.attr not in out:
                                out[target.attr] = ann
        return out

    def bases(self):
        for base in self.node.bases:
            found = resolve_class(self.source, self.module, _expr_text(base))
            if found is not None:
                yield found

    def lookup(self, name, depth=0):
        """(found, annotation, owner ClassInfo) for attribute `name`, through bases."""
        members = self.members()
        if name in members:
            return True, members[name], self
        if depth < 8:
            for base in self.bases():
                found = base.lookup(name, depth + 1)
                if found[0]:
                    return found
        return False, None, None

    def method(self, name):
        for stmt in self.node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                return stmt, self
        for base in self.bases():
            found = base.method(name)
            if found[0] is not None:
                return found
        return None, None


def _name(node):
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _expr_text(node):
    return ast.unparse(node)


def _find_class(tree, qualpath):
    body, node = tree.body, None
    for part in qualpath:
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def _imported(tree, module, name):
    """The module a name is imported from (absolute), and its name there."""
    package = module.rsplit(".", 1)[0] if module else ""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    if node.level:
                        parts = module.split(".")
                        base = ".".join(parts[: len(parts) - node.level])
                        src = f"{base}.{node.module}" if node.module else base
                    else:
                        src = node.module
                    return src, alias.name
    del package
    return None


def resolve_class(source, module, text, depth=0):
    """ClassInfo for the class named `text` (e.g. 'SchedulerOutput',
    'mod.Cls') as seen from `module`, or None."""
    found = source.module(module)
    if found is None or depth > 6:
        return None
    _, tree = found
    parts = text.split(".")
    node = _find_class(tree, parts)
    if node is not None:
        return ClassInfo(source, module, node)
    origin = _imported(tree, module, parts[0])
    if origin is not None:
        src_module, src_name = origin
        return resolve_class(source, src_module, ".".join([src_name, *parts[1:]]), depth + 1)
    return None


def annotation_classes(source, module, annotation):
    """ClassInfos an annotation names (X, 'X', X | None, Optional[X], Union[X, Y])."""
    if annotation is None:
        return []
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return []
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return annotation_classes(source, module, annotation.left) + annotation_classes(
            source, module, annotation.right
        )
    if isinstance(annotation, ast.Subscript) and _name(annotation.value) in ("Optional", "Union"):
        inner = annotation.slice
        items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        return [c for item in items for c in annotation_classes(source, module, item)]
    if isinstance(annotation, (ast.Name, ast.Attribute)):
        found = resolve_class(source, module, _expr_text(annotation))
        return [found] if found is not None else []
    return []


def _chains(tree):
    """(root name, [attr, ...]) for every attribute chain in an EXPR."""
    out = []
    for node in ast.walk(tree):
        chain = []
        cur = node
        while isinstance(cur, (ast.Attribute, ast.Subscript)):
            if isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
            else:
                chain.append(None)  # an index: the type is unknown past here
            cur = cur.value
        if isinstance(cur, ast.Name) and chain and isinstance(node, ast.Attribute):
            out.append((cur.id, list(reversed(chain))))
    # Keep the longest chain per start (a.b.c also yields a.b).
    out.sort(key=lambda c: -len(c[1]))
    kept = []
    for root, chain in out:
        if not any(r == root and c[: len(chain)] == chain for r, c in kept):
            kept.append((root, chain))
    return kept


def check_spec(source, spec):
    """(problems, checked attribute names) for one spec against `source`."""
    if source.module(spec.module) is None:
        return [f"{spec.module}: no such module in the wheel"], []
    *class_path, method_name = spec.path.split(".")
    owner = resolve_class(source, spec.module, ".".join(class_path)) if class_path else None
    if class_path and owner is None:
        return [f"{spec.module}: no class {'.'.join(class_path)}"], []
    if owner is None:
        return [], []  # a module-level function: checked by name only below
    func, _ = owner.method(method_name)
    if func is None:
        return [f"{spec.target}: no method {method_name}"], []
    params = [a.arg for a in func.args.posonlyargs + func.args.args][1:]
    problems, checked = [], []
    for key, text in spec.keywords.items():
        if key == "role":  # plain text for the run group, not an EXPR
            continue
        tree = ast.parse(text, mode="eval")
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id.startswith("arg") and node.id[3:].isdigit():
                if int(node.id[3:]) >= len(params):
                    problems.append(f"{spec.target} {key}: {node.id} but the method takes {params}")
        for root, chain in _chains(tree):
            if root == "self":
                classes = [owner]
            elif root == "result":
                classes = annotation_classes(source, owner.module, func.returns)
            elif root.startswith("arg") and root[3:].isdigit() and int(root[3:]) < len(params):
                arg = (func.args.posonlyargs + func.args.args)[1 + int(root[3:])]
                classes = annotation_classes(source, owner.module, arg.annotation)
            else:
                continue
            for attr in chain:
                if attr is None or not classes:
                    break
                hits = [c.lookup(attr) for c in classes]
                if not any(found for found, _, _ in hits):
                    names = "/".join(c.node.name for c in classes)
                    problems.append(f"{spec.target} {key}: {names} has no attribute {attr!r}")
                    break
                checked.append(f"{root}...{attr}")
                classes = [
                    c
                    for found, ann, where in hits
                    if found
                    for c in annotation_classes(source, where.module, ann)
                ]
    return problems, checked
