"""The stage/batch/work/idle expression language of `attach()`, compiled to source.

An expression such as `len(result[0])`, `arg0.items[-1].x` or
`"prefill" if arg0.max_length_q > 1 else "decode"` is parsed with `ast` at
attach time, checked against a whitelist of node types, and turned into one
Python expression over the wrapper's own local names; the wrapper's source
is then compiled once. At call time it is plain attribute reads, constant
subscripts, comparisons and `len()`: no call of ours, no tuple, list or dict
built per call. It must never accept a construct that calls code the user
did not name (other than attribute/item access and `len`, which run the
object's own methods) or that allocates a container: anything outside the
language is refused here, with the reason, before the wrapper exists.
"""

import ast
import re

# Comparison and arithmetic on numbers and strings allocate no tracked object.
_COMPARE_OPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot)
_CONTAINS_OPS = (ast.In, ast.NotIn)
_BIN_OPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
_ARG_RE = re.compile(r"^arg([0-9]+)$")
_MAX_LENGTH = 400

LANGUAGE = (
    "names: result, self, argN (N-th argument after self) or a parameter's name; "
    "then .ATTR, [INT] (negative counts from the end), [STR]; len(X); "
    "comparisons (== != < <= > >= is, is not, in/not in a literal tuple); "
    "and, or, not; X if COND else Y; + - * // % on numbers; "
    "int, str, bool and None literals"
)


class ExprError(ValueError):
    """An expression outside the language; the message says which part."""


def _fail(text, why):
    raise ExprError(f"bad expression {text!r}: {why} (allowed: {LANGUAGE})")


def _literal_ok(value):
    return value is None or isinstance(value, (bool, int, float, str))


class _Rewriter(ast.NodeTransformer):
    """Checks every node against the whitelist and replaces names by the
    wrapper's code for them (`resolve(name)` -> source text or None)."""

    def __init__(self, text, resolve, len_name):
        self.text = text
        self.resolve = resolve
        self.len_name = len_name

    def generic_visit(self, node):
        _fail(self.text, f"{type(node).__name__} is not allowed")

    def visit_Expression(self, node):
        node.body = self.visit(node.body)
        return node

    def visit_Name(self, node):
        if not isinstance(node.ctx, ast.Load):
            _fail(self.text, f"cannot assign {node.id}")
        code = self.resolve(node.id)
        if code is None:
            _fail(self.text, f"unknown name {node.id!r}")
        return ast.copy_location(ast.parse(code, mode="eval").body, node)

    def visit_Attribute(self, node):
        if node.attr.startswith("__"):
            # Dunder reads can materialise objects (an instance's __dict__).
            _fail(self.text, f"attribute {node.attr!r} is not allowed")
        node.value = self.visit(node.value)
        return node

    def visit_Subscript(self, node):
        index = node.slice
        if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
            index = index.operand
            if not (isinstance(index, ast.Constant) and type(index.value) is int):
                _fail(self.text, "only -INT may be negated in a subscript")
        elif not (isinstance(index, ast.Constant) and type(index.value) in (int, str)):
            # Slices build a new list/tuple; computed indices hide calls.
            _fail(self.text, "a subscript must be an int or str literal")
        node.value = self.visit(node.value)
        return node

    def visit_Call(self, node):
        if not (
            isinstance(node.func, ast.Name)
            and node.func.id == "len"
            and len(node.args) == 1
            and not node.keywords
            and not isinstance(node.args[0], ast.Starred)
        ):
            _fail(self.text, "the only call allowed is len(X)")
        node.args = [self.visit(node.args[0])]
        # The wrapper's own name for len: a parameter may be called `len`.
        node.func = ast.Name(id=self.len_name, ctx=ast.Load())
        return node

    def visit_Compare(self, node):
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, _CONTAINS_OPS):
                if not (
                    isinstance(right, ast.Tuple)
                    and all(
                        isinstance(e, ast.Constant) and _literal_ok(e.value) for e in right.elts
                    )
                ):
                    # A literal tuple of constants is one constant: no build.
                    _fail(self.text, "`in` needs a literal tuple of constants on its right")
            elif not isinstance(op, _COMPARE_OPS):
                _fail(self.text, f"{type(op).__name__} is not allowed")
        node.left = self.visit(node.left)
        node.comparators = [
            c if isinstance(op, _CONTAINS_OPS) else self.visit(c)
            for op, c in zip(node.ops, node.comparators, strict=True)
        ]
        return node

    def visit_BoolOp(self, node):
        node.values = [self.visit(v) for v in node.values]
        return node

    def visit_UnaryOp(self, node):
        if not isinstance(node.op, (ast.Not, ast.USub)):
            _fail(self.text, f"{type(node.op).__name__} is not allowed")
        node.operand = self.visit(node.operand)
        return node

    def visit_BinOp(self, node):
        if not isinstance(node.op, _BIN_OPS):
            _fail(self.text, f"{type(node.op).__name__} is not allowed")
        node.left = self.visit(node.left)
        node.right = self.visit(node.right)
        return node

    def visit_IfExp(self, node):
        node.test = self.visit(node.test)
        node.body = self.visit(node.body)
        node.orelse = self.visit(node.orelse)
        return node

    def visit_Constant(self, node):
        if not _literal_ok(node.value):
            _fail(self.text, f"literal {node.value!r} is not allowed")
        return node


def compile_expr(text, resolve, len_name="len"):
    """Source text of `text` over the wrapper's names.

    `resolve(name)` returns the wrapper's code for a name of the language
    (`result`, `self`, `argN`, a parameter's name) or None if it has none;
    it may raise ExprError to say why (e.g. no self)."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"bad expression {text!r}: expected a non-empty string")
    if len(text) > _MAX_LENGTH:
        raise ExprError(f"bad expression: longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"bad expression {text!r}: {exc.msg}") from None
    tree = _Rewriter(text, resolve, len_name).visit(tree)
    return "(" + ast.unparse(tree.body) + ")"


def last_name(text):
    """The expression's final attribute or name (`arg0.is_prefill` ->
    `is_prefill`): the stage recorded when a stage expression is True."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return text
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return text.strip()


def arg_index(name):
    """N for `argN`, else None."""
    m = _ARG_RE.match(name)
    return int(m.group(1)) if m else None
