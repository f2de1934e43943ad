"""``codesdk-supervisor secret-key rotate``: re-encrypt every namespace variable in the database under a new key.

First give every supervisor the new key as its key and the old one as an old key (``--old-secret-key-file``)
and restart them one by one; then run this; then drop the old key (docs/operations.md, "Rotating the secret
key"). It says how many rows it re-encrypted; it never
prints a value or a key.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..namespaces import (
    KEY_ENV,
    OLD_KEYS_ENV,
    NamespaceStateUnavailable,
    SecretKey,
    SecretKeyError,
    UndecryptableVariable,
    load_old_keys,
    load_secret_key,
    read_key_file,
    rotate_secret_key,
)
from ..store import StoreError, is_postgres_url
from .common import EXIT_USAGE

EXIT_FAILED = 1


def add_secret_key_flag(parser: argparse.ArgumentParser, old_keys: bool = True) -> None:
    """``--secret-key-file``, and unless ``old_keys`` is False ``--old-secret-key-file`` (opening rows only)."""
    parser.add_argument("--secret-key-file", type=_secret_key_file, default=None, metavar="FILE",
                        help="with --store postgresql://: the deployment's secret key (base64 of 32 bytes; make one "
                             "with `head -c32 /dev/urandom | base64`), which namespace variables are encrypted under "
                             f"in the database; the same on every supervisor. Default: ${KEY_ENV}")
    if not old_keys:
        return
    parser.add_argument("--old-secret-key-file", type=_secret_key_file, action="append", default=[],
                        metavar="OLD", dest="old_secret_key_files",
                        help="during a rotation: a previous key, used only to open variables not yet re-encrypted "
                             "(new writes use --secret-key-file's key); repeatable. Default: "
                             f"${OLD_KEYS_ENV} (base64 keys separated by commas)")


def _secret_key_file(text: str) -> SecretKey:
    try:
        return read_key_file(Path(text))
    except SecretKeyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def secret_key_of(args: argparse.Namespace) -> SecretKey | None:
    """``--secret-key-file``'s key, else ``$CODESDK_SECRET_KEY``'s (``SecretKeyError``), else None."""
    given: SecretKey | None = getattr(args, "secret_key_file", None)
    return given if given is not None else load_secret_key(None)


def old_secret_keys_of(args: argparse.Namespace) -> tuple[SecretKey, ...]:
    """``--old-secret-key-file``'s keys, else ``$CODESDK_OLD_SECRET_KEYS``'s (``SecretKeyError``)."""
    given: list[SecretKey] = getattr(args, "old_secret_key_files", None) or []
    return tuple(given) if given else load_old_keys()


def add_secret_key_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], prog: str) -> None:
    secret = sub.add_parser("secret-key", help="the deployment's secret key (namespace variables in PostgreSQL)")
    secret_sub = secret.add_subparsers(dest="secret_key_command", required=True)
    rotate = secret_sub.add_parser(
        "rotate", help="re-encrypt every namespace variable in the database under a new key (idempotent)")
    rotate.add_argument("--store", required=True, metavar="URL", help="the postgresql:// store the supervisors share")
    rotate.add_argument("--secret-key-file", type=Path, required=True, metavar="NEW",
                        help="the new key (base64 of 32 bytes: `head -c32 /dev/urandom | base64`)")
    rotate.add_argument("--old-secret-key-file", type=Path, action="append", required=True, metavar="OLD",
                        help="a key the variables may be encrypted under now (repeatable)")
    rotate.set_defaults(run=lambda args: rotate_command(args, prog))


def rotate_command(args: argparse.Namespace, prog: str) -> int:
    where = f"{prog} secret-key rotate"
    if not is_postgres_url(args.store):
        print(f"{where}: error: --store must be a postgresql:// URL (on SQLite, namespace variables stay in the data "
              "dir's files, not encrypted under a key)", file=sys.stderr)
        return EXIT_USAGE
    try:
        new = read_key_file(args.secret_key_file)
        old: list[SecretKey] = [read_key_file(path) for path in args.old_secret_key_file]
    except SecretKeyError as exc:
        print(f"{where}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = rotate_secret_key(args.store, new, old)
    except (SecretKeyError, UndecryptableVariable) as exc:
        print(f"{where}: error: {exc}; nothing was changed", file=sys.stderr)
        return EXIT_USAGE
    except (NamespaceStateUnavailable, StoreError) as exc:
        print(f"{where}: {exc}; nothing was changed", file=sys.stderr)
        return EXIT_FAILED
    print(f"{report.describe()}; the database's variables are now all under key {new.key_id}: the old "
          "key(s) can now be dropped from every supervisor (--old-secret-key-file / $CODESDK_OLD_SECRET_KEYS)")
    return 0
