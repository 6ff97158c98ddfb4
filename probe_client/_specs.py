"""Attach specs: the text form `module:Qualname.method=kind[,KEY=EXPR]...` and its TOML form.

A spec says which method to wrap and how, without editing the engine:
`stallscope run --attach SPEC`, `$STALLSCOPE_ATTACH` (specs separated by
`;`) and `[[attach]]` tables in a TOML file (`--attach-file`, presets,
`$STALLSCOPE_ATTACH_FILE`) all become `Spec` objects here. Every KEY=EXPR is
handed to `probe.attach(...)` unchanged, so a keyword `attach()` gains later
works in specs at once; this module only checks the spec's shape. Quoting
rule: an EXPR ends at the next `,` (or `;`) that is outside brackets and
string literals; an EXPR that starts with a single quote is quoted whole,
runs to the matching quote, and writes a single quote inside as two (`''`).
A leading `?` marks a spec optional (no report when its module is never
imported in a process). Runs at start-up only, never on a hot path; raises
`SpecError` with the reason. Standard library only.
"""

import re

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KIND = re.compile(r"^[A-Za-z0-9_.:/-]{1,24}$")
_OPEN = {"(": ")", "[": "]", "{": "}"}
_MAX_SPEC = 2000

# TOML keys of an [[attach]] table that are the spec itself, not attach() keywords.
_TOML_OWN_KEYS = ("target", "kind", "optional")


class SpecError(ValueError):
    """A spec that cannot be used; the message quotes it and says why."""


class Spec:
    """One attach spec: wrap `module`'s `path` (Qualname.method) as `kind`,
    passing `keywords` (name -> EXPR text) to `attach()`."""

    __slots__ = ("module", "path", "kind", "keywords", "optional", "text")

    def __init__(self, module, path, kind, keywords=None, optional=False, text=None):
        self.module = module
        self.path = path
        self.kind = kind
        self.keywords = dict(keywords or {})
        self.optional = bool(optional)
        self.text = text if text is not None else format_spec(self)

    @property
    def target(self):
        return f"{self.module}:{self.path}"

    def __eq__(self, other):
        return isinstance(other, Spec) and (
            self.module,
            self.path,
            self.kind,
            self.keywords,
            self.optional,
        ) == (other.module, other.path, other.kind, other.keywords, other.optional)

    def __repr__(self):
        return f"Spec({format_spec(self)!r})"


def _split(text, sep, brackets=True):
    """`text` cut at each `sep` outside brackets and string literals.

    Quotes pair up as string delimiters, so a quoted EXPR (`'a,b'`, `'it''s'`)
    and a literal inside a bare EXPR (`"a;b"`) both stay whole. Raises on an
    unclosed quote or bracket. With brackets=False only quotes protect a
    `sep` (specs are cut at `;` this way: one spec's unbalanced bracket must
    not swallow the next spec)."""
    pieces, depth, quote, start, i = [], [], None, 0, 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1  # an escaped character inside a "..." literal
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif not brackets:
            if c == sep:
                pieces.append(text[start:i])
                start = i + 1
        elif c in _OPEN:
            depth.append(_OPEN[c])
        elif c in ")]}":
            if not depth or depth.pop() != c:
                raise SpecError(f"unbalanced {c!r} at character {i + 1}")
        elif c == sep and not depth:
            pieces.append(text[start:i])
            start = i + 1
        i += 1
    if quote:
        raise SpecError(f"unclosed {quote} quote")
    if depth:
        raise SpecError(f"unclosed bracket (expected {depth[-1]!r})")
    pieces.append(text[start:])
    return pieces


def _unquote(expr):
    """A quoted EXPR's text ('' -> '), or a bare EXPR as it is."""
    if not expr.startswith("'"):
        return expr
    out, i = [], 1
    while i < len(expr):
        c = expr[i]
        if c == "'":
            if expr[i + 1 : i + 2] == "'":
                out.append("'")
                i += 2
                continue
            if expr[i + 1 :].strip():
                raise SpecError(
                    f"text after the closing quote of {expr!r}: quote the whole EXPR, "
                    "or start it with something other than a single quote"
                )
            return "".join(out)
        out.append(c)
        i += 1
    raise SpecError(f"unclosed quote in {expr!r}")


def parse_spec(text):
    """`[?]module:Qualname.method=kind[,KEY=EXPR]...` -> Spec; raises SpecError."""
    if not isinstance(text, str):
        raise SpecError(f"a spec is a string, not {type(text).__name__}")
    raw = text.strip()
    if len(raw) > _MAX_SPEC:
        raise SpecError(f"spec longer than {_MAX_SPEC} characters")
    try:
        return _parse(raw)
    except SpecError as exc:
        raise SpecError(f"bad attach spec {raw!r}: {exc}") from None


def _parse(raw):
    optional = raw.startswith("?")
    if optional:
        raw = raw[1:].lstrip()
    items = _split(raw, ",")
    head = items[0].strip()
    if "=" not in head:
        raise SpecError("expected module:Qualname.method=kind")
    target, kind = (s.strip() for s in head.split("=", 1))
    module, path = _split_target(target)
    if not _KIND.match(kind):
        raise SpecError(f"kind {kind!r}: 1-24 characters of letters, digits and _.:/-")
    keywords = {}
    for item in items[1:]:
        if "=" not in item:
            raise SpecError(f"{item.strip()!r}: expected KEY=EXPR")
        key, expr = item.split("=", 1)
        key, expr = key.strip(), expr.strip()
        _check_keyword(key, keywords)
        expr = _unquote(expr)
        if not expr.strip():
            raise SpecError(f"{key}: empty EXPR")
        keywords[key] = expr
    return Spec(module, path, kind, keywords, optional, text=raw if not optional else "?" + raw)


def _split_target(target):
    if target.count(":") != 1:
        raise SpecError(f"target {target!r}: expected module:Qualname.method (one ':')")
    module, path = (s.strip() for s in target.split(":"))
    if not _DOTTED.match(module):
        raise SpecError(f"module {module!r} is not a dotted name")
    if not _DOTTED.match(path):
        raise SpecError(f"{path!r} is not a dotted Qualname.method")
    return module, path


def _check_keyword(key, keywords):
    if not _KEY.match(key):
        raise SpecError(f"{key!r} is not a keyword name")
    if key in ("kind", "target", "path"):
        raise SpecError(f"{key!r} is part of the spec itself (module:Qualname.method=kind)")
    if key in keywords:
        raise SpecError(f"{key} given twice")


def split_specs(text):
    """The specs of `$STALLSCOPE_ATTACH`: `;`-separated, blanks ignored.

    Returns (specs, errors): a bad spec is an error string, the others stay."""
    specs, errors = [], []
    try:
        pieces = _split(text or "", ";", brackets=False)
    except SpecError:
        pieces = (text or "").split(";")  # an unclosed quote: each piece says so itself
    for piece in pieces:
        if not piece.strip():
            continue
        try:
            specs.append(parse_spec(piece))
        except SpecError as exc:
            errors.append(str(exc))
    return specs, errors


def format_spec(spec):
    """The text form of `spec`, every EXPR quoted (parse_spec reads it back)."""
    out = ("?" if spec.optional else "") + f"{spec.module}:{spec.path}={spec.kind}"
    for key, expr in spec.keywords.items():
        out += f",{key}='" + expr.replace("'", "''") + "'"
    return out


def specs_from_toml(data, source):
    """Specs of a parsed TOML document (`[[attach]]` tables).

    Returns (specs, errors); `source` names the file in messages."""
    specs, errors = [], []
    tables = data.get("attach", [])
    if not isinstance(tables, list):
        return [], [f"{source}: `attach` must be an array of tables ([[attach]])"]
    for n, table in enumerate(tables, 1):
        where = f"{source} [[attach]] #{n}"
        try:
            specs.append(_spec_from_table(table, where))
        except SpecError as exc:
            errors.append(f"{where}: {exc}")
    return specs, errors


def _spec_from_table(table, where):
    if not isinstance(table, dict):
        raise SpecError("not a table")
    target, kind = table.get("target"), table.get("kind")
    if not isinstance(target, str) or not isinstance(kind, str):
        raise SpecError('needs target = "module:Qualname.method" and kind = "..."')
    module, path = _split_target(target.strip())
    if not _KIND.match(kind):
        raise SpecError(f"kind {kind!r}: 1-24 characters of letters, digits and _.:/-")
    optional = table.get("optional", False)
    if not isinstance(optional, bool):
        raise SpecError("optional must be true or false")
    keywords = {}
    for key, expr in table.items():
        if key in _TOML_OWN_KEYS:
            continue
        _check_keyword(key, keywords)
        if not isinstance(expr, str) or not expr.strip():
            raise SpecError(f"{key} must be a non-empty string (an EXPR)")
        keywords[key] = expr.strip()
    return Spec(module, path, kind, keywords, optional)


def load_toml(path):
    """Parse a TOML file with tomllib (3.11+) or tomli; raises SpecError."""
    try:
        import tomllib as toml
    except ImportError:
        try:
            import tomli as toml
        except ImportError:
            raise SpecError(
                f"{path}: reading TOML needs Python 3.11+ or the tomli package; "
                "give the specs in $STALLSCOPE_ATTACH instead"
            ) from None
    try:
        with open(path, "rb") as f:
            return toml.load(f)
    except OSError as exc:
        raise SpecError(f"{path}: {exc.strerror}") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
