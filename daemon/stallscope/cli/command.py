"""What every `stallscope` subcommand is made of, and the options they share.

A `Command` holds a subcommand's one-line help, its description, the
function that adds its arguments, its entry point `run(args) -> exit status`
and the two or three examples its `--help` ends with (as bcc's tools do).
`stallscope.cli` keeps the table of commands; each command-group module
defines its `Command`s. Nothing here prints or exits: entry points raise
`StallscopeError`, which `stallscope.cli.main` turns into `error: ...`.
"""

import argparse
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from stallscope.service.config import DEFAULT_API_SOCKET, DEFAULT_DB


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    examples: tuple[str, ...]  # "command line  # what it shows"
    description: str = ""

    def register(self, subparsers, name):
        """Add this command as `name` to `subparsers`; returns its parser."""
        parser = subparsers.add_parser(
            name,
            help=self.help,
            description=textwrap.fill(self.description or self.help, 79),
            epilog="examples:\n" + "\n".join(f"    {line}" for line in self.examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        self.add_arguments(parser)
        return parser


def env_default(name, default):
    """$name when set and not empty, else `default` (for read-side flags)."""
    return os.environ.get(name) or default


def add_db_arguments(parser):
    """--db and --api-socket: where a read command finds the data."""
    parser.add_argument(
        "--db",
        default=env_default("STALLSCOPE_DB", DEFAULT_DB),
        help="DuckDB file (default: $STALLSCOPE_DB or %(default)s)",
    )
    parser.add_argument(
        "--api-socket",
        default=env_default("STALLSCOPE_API_SOCKET", None),
        help="a running daemon's API socket, used when it holds the database "
        "(default: $STALLSCOPE_API_SOCKET, else the socket the daemon published "
        f"beside the database, else {DEFAULT_API_SOCKET})",
    )
