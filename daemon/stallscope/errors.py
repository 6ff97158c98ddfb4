"""The errors stallscope raises on purpose: one base, a few kinds.

Library code raises these with a message a user can act on ("no database at
PATH (set --db or $STALLSCOPE_DB)"); only `stallscope.cli` turns them into
`error: ...` on stderr and an exit status. Library code never calls
`sys.exit` or raises `SystemExit`, and nothing here imports another
stallscope module, so every module can import this one without a circle.
An exception that is not a `StallscopeError` is a bug and keeps its
traceback.
"""


class StallscopeError(Exception):
    """An expected failure: the CLI prints `error: <heading: >message`."""

    exit_status = 2
    heading = ""  # what failed, put before the message by the CLI

    def user_message(self):
        return f"{self.heading}: {self}" if self.heading else str(self)


class ConfigError(StallscopeError):
    """A configuration the daemon refuses: str() says where (file:line, flag,
    environment variable) and why."""

    heading = "configuration refused"


class ApiConfigError(ConfigError):
    """The API cannot start as configured (plain-text TCP, half a TLS setup,
    unreadable files, socket in use); the message says how to fix it."""

    heading = ""


class ActivationError(ConfigError):
    """What systemd passed (LISTEN_FDS, LISTEN_FDNAMES) cannot be used."""

    heading = "socket activation"


class ServiceError(StallscopeError):
    """The daemon (or the demo's child daemon) cannot start or run."""


class AccessError(StallscopeError):
    """Why the data cannot be read, said so that a user can act on it."""


class RunNotFound(AccessError):
    """A run named on the command line is not in the database."""


class ApiError(StallscopeError):
    """The daemon's API refused or could not answer; the message is the
    daemon's, `code` its gRPC status code (None when no call was made)."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class QueryError(StallscopeError):
    """A Query that cannot run as written (syntax, unknown names, types,
    parameters, not exactly one statement); sent back as INVALID_ARGUMENT.
    Its subclasses say when another status code fits better."""


class QueryRefused(QueryError):
    """What the sandbox refuses (writes, file reads, settings, extensions,
    EXPLAIN ANALYZE); sent back as PERMISSION_DENIED."""


class QueryTimeout(QueryError):
    """A Query interrupted at its time limit; sent back as DEADLINE_EXCEEDED."""


class QueryTooLarge(QueryError):
    """A single result row larger than the message size limit; sent back as
    RESOURCE_EXHAUSTED."""


class NotSandboxed(StallscopeError):
    """The DuckDB build cannot confine a Query to reading: the API refuses
    every Query rather than run one unconfined."""


class ProbeError(StallscopeError):
    """A probe backend failed while starting or running (not: unavailable
    here, which is a reason string, never an error)."""


class SchemaVersionError(StallscopeError):
    """A database written by a newer stallscope (its schema version is above
    this release's): refused before anything is written to it."""

    heading = "database refused"


class ExportBusy(StallscopeError):
    """An export is already running; the API answers ABORTED."""
