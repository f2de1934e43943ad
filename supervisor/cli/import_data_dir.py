"""``codesdk-supervisor import-data-dir --store postgresql://… --data-dir D``: move what a single host kept in its
data dir into the database several supervisors share, so that every host reads the same.

Each kind of state moves on its own (``_MOVES``: the API tokens, then the namespaces' variables and limits),
once: a later run never overwrites or re-adds what an earlier one moved (changes made in the database since are
kept) and says what it skipped. Refused while the data dir's supervisor still runs (it holds the data dir's lock). It prints what it moved, by count and id, never a secret. Exit status: 0 when
everything is in the database, 1 when something could not be moved (said, with what to do) or the database
failed, 2 for bad input (a URL that is not PostgreSQL's, a data dir that is not one, a file that does not parse).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from ..api import PostgresTokenStore, TokenFileInvalid, move_tokens
from ..namespaces import (
    NamespaceStateUnavailable,
    SecretKey,
    SecretKeyError,
    UndecryptableVariable,
    import_namespace_state,
    require_secret_key,
)
from ..store import StoreError, check_store_url, current_holder, open_token_table
from .common import add_store_flag, data_dir
from .secret_key import add_secret_key_flag, secret_key_of

PROG = "codesdk-supervisor"


def import_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = sub.add_parser("import-data-dir", help="move a data dir's API tokens, namespace variables and limits "
                                                     "into the PostgreSQL database the supervisors share "
                                                     "(idempotent; prints no secret)")
    command.add_argument("--data-dir", type=data_dir, required=True, help="the data dir to move from")
    add_store_flag(command, "the PostgreSQL database to move into (serve's --store; required)")
    add_secret_key_flag(command, old_keys=False)  # what it moves is sealed under the key; it opens nothing older
    command.set_defaults(run=import_command)


class Moved:
    """One kind of state moved: the lines that say how, and whether anything stayed behind."""

    def __init__(self, lines: list[str], complete: bool) -> None:
        self.lines = lines
        self.complete = complete


def _tokens(source: Path, url: str, key: SecretKey) -> Moved:
    table = open_token_table(url)
    try:
        moved = move_tokens(source, PostgresTokenStore(table))
    finally:
        table.close()
    return Moved(moved.lines(), not moved.refused)


def _namespace_state(source: Path, url: str, key: SecretKey) -> Moved:
    report = import_namespace_state(source, url, key)
    return Moved([report.describe()], True)


#: What is moved, in order; each takes the data dir, the database URL and the deployment's secret key.
_MOVES: tuple[Callable[[Path, str, SecretKey], Moved], ...] = (_tokens, _namespace_state)


def import_command(args: argparse.Namespace) -> int:
    source: Path = args.data_dir
    if args.store is None:
        return _refuse("import-data-dir needs --store postgresql://USER@HOST/DB (or $CODESDK_STORE): the database "
                       "to move the data dir's state into")
    if not source.is_dir():
        return _refuse(f"the data dir {source} does not exist; give the one the single-host service used "
                       "(the unit's: /var/lib/codesdk)")
    holder = current_holder(source)
    if holder is not None:  # it would go on changing the files, and the database, after they were moved
        return _refuse(f"the data dir {source} is in use by {holder.describe()}: stop that supervisor first "
                       f"(`systemctl stop codesdk`, or end pid {holder.pid}), then run this again")
    try:
        check_store_url(args.store)
        key = require_secret_key(secret_key_of(args),
                                 "import-data-dir (namespace variables are encrypted in the database)")
    except (StoreError, SecretKeyError) as exc:
        return _refuse(str(exc))
    complete = True
    try:
        for move in _MOVES:
            moved = move(source, args.store, key)
            for line in moved.lines:
                print(line)
            complete = complete and moved.complete
    except TokenFileInvalid as exc:
        return _refuse(f"{exc}; nothing of it was moved: fix the file and run this again")
    except UndecryptableVariable as exc:
        return _refuse(f"{exc}; give the key the database's variables are encrypted under")
    except (StoreError, NamespaceStateUnavailable) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        return _refuse(f"cannot read the data dir ({exc}); run as the service's user")
    if not complete:
        print(f"{PROG}: some of the data dir's state was not moved (see above)", file=sys.stderr)
        return 1
    return 0


def _refuse(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2
