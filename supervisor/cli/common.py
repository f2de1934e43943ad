"""What the local and the remote ``codesdk`` commands share: exit codes, stop signals, flag rules, user errors.

Imported by ``front`` before the heavy imports: the standard library only."""

from __future__ import annotations

import argparse
import errno
import getpass
import json
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..egress import EgressPolicy, HostPattern, IPNetwork, PatternError, parse_network

if TYPE_CHECKING:
    from ..engine import QuestionPolicy

#: Exit codes of ``codesdk run`` (README): a stop by signal exits 128 + the signal's number, as shells report.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 128 + signal.SIGINT
#: A refusal the command could not have avoided (sysexits' EX_UNAVAILABLE): a namespace's worker failing, a runtime
#: not answering, a session busy, a quota reached. Try again later, or the operator acts; EXIT_USAGE is for
#: refusals the command itself must change to get past.
EXIT_UNAVAILABLE = 69
#: HTTP statuses of the API's refusals that are the service's state, not the request's fault (``api_exit_code``).
_UNAVAILABLE_STATUSES = frozenset({402, 421, 429, 503})  # 421: another supervisor runs the namespace; 402: its
# monthly budget is spent
#: Signals that stop the running task (task.stopped) rather than kill the process: Ctrl-C, systemd/kill, a
#: closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DEFAULT_RUNTIME, DEFAULT_NAMESPACE = "scripted", "default"
#: ``protocol.api.MAX_TITLE``, ``protocol.api.SessionFilter``'s and ``protocol.IsolationLevel``'s values, the default
#: first (here without importing the protocol; a test holds them equal).
MAX_TITLE = 200
SESSION_STATES = ("live", "idle", "busy", "archived", "all")
ISOLATION_LEVELS = ("namespaced", "ephemeral", "shared")


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


# -- flag values: every bad one is a usage error of one line (exit 2), refused while parsing ------------------

#: ``protocol.RUNTIME_NAME_PATTERN`` (here without importing the protocol; a test holds them equal).
RUNTIME_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
#: Variables CodeSDK sets for every worker: ``run --env`` may not override them (as ``namespace env set`` refuses).
RESERVED_ENV = frozenset({"HOME", "PATH", "TMPDIR", "LANG", "LC_ALL"})  # namespaces.RESERVED's, without XDG_*
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose refusals are one line on stderr (exit 2): ``prog: error: what (see --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _refuse(what: str) -> NoReturn:
    raise argparse.ArgumentTypeError(what)


def text(value: str) -> str:
    """A flag's text: not empty, no NUL (no file name, variable or URL holds one)."""
    if not value.strip():
        _refuse("an empty value is no value; give one, or leave the flag out")
    if "\x00" in value:
        _refuse(f"{value!r} has a NUL character")
    return value


def path(value: str) -> Path:
    return Path(text(value))


def runtime_name(value: str) -> str:
    if not RUNTIME_NAME.fullmatch(value):
        _refuse(f"{value!r} is not a runtime's name (lowercase letters, digits, '.', '_' and '-', at most 64); "
                "`codesdk-supervisor` or GET /v1/runtimes lists those a namespace can run")
    return value


def namespace_name(value: str) -> str:
    from ..namespaces import InvalidNamespace, Namespace  # run_ahead imports it anyway: light

    try:
        Namespace.parse(value)
    except InvalidNamespace as exc:
        _refuse(str(exc))
    return value


def config_item(value: str) -> str:
    """``--config KEY=VALUE``: a non-empty key."""
    key, sep, _ = value.partition("=")
    if not sep or not key.strip():
        _refuse(f"expected KEY=VALUE with a non-empty KEY, got {value!r}")
    return value


def env_item(value: str) -> str:
    """``--env KEY=VALUE``: a variable's name, and not one CodeSDK sets for every worker (HOME, PATH, XDG_*,
    TMPDIR...: the namespace's isolation rests on them)."""
    key, sep, _ = value.partition("=")
    if not sep or not _ENV_NAME.fullmatch(key):
        _refuse(f"expected KEY=VALUE with KEY a variable's name (letters, digits, '_'), got {value!r}")
    if key in RESERVED_ENV or key.startswith("XDG_"):
        _refuse(f"{key} is set by CodeSDK for every worker (the namespace's isolation rests on it) and cannot be "
                "overridden")
    if "\x00" in value:
        _refuse(f"the value of {key} has a NUL character, which no environment can hold")
    return value


def fetch_host(value: str) -> HostPattern:
    """``--allow-fetch HOST_PATTERN``: ``example.com``, ``*.example.com``, an IP literal, each with an optional
    ``:PORT``."""
    try:
        return HostPattern.parse(text(value))
    except PatternError as exc:
        _refuse(str(exc))


def fetch_address(value: str) -> IPNetwork:
    """``--allow-fetch-address CIDR``: an address range http.fetch may reach although it is not public."""
    try:
        return parse_network(text(value))
    except PatternError as exc:
        _refuse(str(exc))


def add_fetch_flags(parser: argparse.ArgumentParser, whom: str) -> None:
    """The flags that enable ``http.fetch`` (``codesdk run`` and ``codesdk-supervisor serve`` alike)."""
    parser.add_argument("--allow-fetch", action="append", type=fetch_host, metavar="HOST_PATTERN", default=None,
                        help=f"enable the http.fetch tool {whom}, for URLs on this host: example.com, *.example.com "
                             "(hosts below it), or an IP, each with an optional :PORT (else the scheme's default "
                             "port); repeatable. Each call still needs approval, in every permission mode unless "
                             "--allow-fetch-unattended. Default: off")
    parser.add_argument("--allow-fetch-address", action="append", type=fetch_address, metavar="CIDR", default=None,
                        help="let http.fetch connect to these addresses although they are not public (loopback, "
                             "private, link-local...: refused otherwise); repeatable")
    parser.add_argument("--allow-fetch-post", action="store_true",
                        help="let http.fetch send POST requests (with a body); default: GET and HEAD only")
    parser.add_argument("--allow-fetch-unattended", action="store_true",
                        help="let tasks in permission mode yolo run http.fetch without asking (non-interactive yolo "
                             "tasks fetch instead of being denied); the allowed hosts still apply, and auto and ask "
                             "tasks still ask. Default: every fetch needs approval")


def fetch_options(args: argparse.Namespace) -> EgressPolicy:
    """The egress policy of ``http.fetch`` from the fetch flags (no hosts: the tool is off)."""
    return EgressPolicy(hosts=tuple(args.allow_fetch or ()), addresses=tuple(args.allow_fetch_address or ()),
                        allow_post=args.allow_fetch_post)


def fetch_flags_refusal(args: argparse.Namespace) -> str | None:
    """Why the fetch flags given make no sense together (None: they do)."""
    given = [flag for flag, value in (("--allow-fetch-address", args.allow_fetch_address),
                                      ("--allow-fetch-post", args.allow_fetch_post),
                                      ("--allow-fetch-unattended", args.allow_fetch_unattended)) if value]
    if not args.allow_fetch and given:
        return f"{given[0]} has no effect without --allow-fetch HOST_PATTERN, which enables http.fetch"
    return None


def regex(value: str) -> str:
    try:
        re.compile(text(value))
    except re.error as exc:
        _refuse(f"{value!r} is not a regular expression: {exc}")
    return value


def data_dir(value: str) -> Path:
    """A data directory that is or can be one: not a file, not under a file, not where no directory can be made
    (``/proc/…``; probed, and what the probe makes it removes again). Permissions are left to the command, which
    says what privilege it lacks."""
    where = path(value).expanduser().absolute()
    missing: list[Path] = []
    probe = where
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    if not probe.is_dir():
        _refuse(f"{probe} is not a directory, so {where} cannot be a data directory")
    try:
        for made in reversed(missing):
            made.mkdir()
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM):
            _refuse(f"{where} cannot be made ({exc.strerror or exc}); choose another directory")
    finally:
        for made in missing:
            try:
                made.rmdir()
            except OSError:
                pass
    return where


def add_question_flags(parser: argparse.ArgumentParser, whom: str) -> None:
    """How long a runtime's question waits for its user, and what it becomes then (docs/sessions.md, Questions)."""
    parser.add_argument("--question-timeout", type=seconds, default=None, metavar="SECONDS",
                        help=f"how long a runtime's question waits for an answer {whom} before --question-fallback "
                             "answers it (default 900)")
    parser.add_argument("--question-fallback", choices=("decline", "default"), default=None,
                        help="what an unanswered question becomes: declined, or each question's default answer (a "
                             "request with a required question that has none is declined; default decline)")


def question_policy(args: argparse.Namespace) -> QuestionPolicy:
    """The engine's ``QuestionPolicy`` from the flags (imported here: this module stays light)."""
    from ..engine import QUESTION_TIMEOUT_S, QuestionFallback, QuestionPolicy

    timeout = getattr(args, "question_timeout", None)
    return QuestionPolicy(timeout_s=QUESTION_TIMEOUT_S if timeout is None else timeout,
                          fallback=QuestionFallback(getattr(args, "question_fallback", None) or "decline"))


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (a usage error otherwise, never a traceback)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


#: The largest budget limit, ``protocol.MAX_LIMIT`` (here without importing the protocol; a test holds them equal).
MAX_BUDGET_LIMIT = 2**53


def usd(text: str) -> float:
    """An argparse type: a finite number of USD, 0 to ``MAX_BUDGET_LIMIT`` (a usage error otherwise, never a
    traceback)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_BUDGET_LIMIT:
        raise argparse.ArgumentTypeError(f"expected a number of USD from 0 to 2^53, got {text!r}")
    return value


def count(text: str) -> int:
    """An argparse type: a whole number, 0 to ``MAX_BUDGET_LIMIT``."""
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_BUDGET_LIMIT:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 2^53, got {text!r}")
    return int(text)


def budget_limits(args: argparse.Namespace, prefix: str = "budget_") -> dict[str, float] | None:
    """The limits given by ``--{prefix}tokens``, ``--{prefix}usd``, ``--{prefix}tool-calls`` as a budget body
    (``{"tokens": N, "cost_usd": X, "tool_calls": N}``), or None when none was."""
    given = {"tokens": getattr(args, f"{prefix}tokens", None), "cost_usd": getattr(args, f"{prefix}usd", None),
             "tool_calls": getattr(args, f"{prefix}tool_calls", None)}
    limits = {name: value for name, value in given.items() if value is not None}
    return limits or None


def add_budget_flags(parser: argparse.ArgumentParser, prefix: str, whose: str) -> None:
    """``--{prefix}tokens N``, ``--{prefix}usd X``, ``--{prefix}tool-calls N``: limits of ``whose`` budget."""
    parser.add_argument(f"--{prefix}tokens", type=count, metavar="N",
                        help=f"{whose}: input plus output tokens, as the runtime reports them")
    parser.add_argument(f"--{prefix}usd", type=usd, metavar="USD",
                        help=f"{whose}: cost in USD (the runtime's, else the operator's price table)")
    parser.add_argument(f"--{prefix}tool-calls", type=count, metavar="N",
                        help=f"{whose}: tool calls that may run (the next one stops the task)")


def port(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or not 0 <= int(value) <= 65535:
        _refuse(f"{value!r} is not a TCP port (0-65535; 0: any free one)")
    return int(value)


def strict_values(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every flag and argument of ``parser`` and its subcommands that takes free text refuses an empty one (a
    ``Path`` one too): a value that is no value is a usage error, not a default chosen silently."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                strict_values(child)
        elif action.nargs != 0 and action.choices is None:
            kind: Callable[[str], Any] | None = action.type  # type: ignore[assignment]
            if kind is None or kind is str:
                action.type = text
            elif kind is Path:
                action.type = path
    return parser


def check_session_flags(args: argparse.Namespace, namespace: str) -> None:
    """``run --session``: the session decides the namespace; a flag that says otherwise is an error. (``--runtime``
    moves the session to that runtime.)"""
    if args.namespace and args.namespace != namespace:
        raise CliError(f"session {args.session} belongs to namespace {namespace!r}, not {args.namespace!r}; "
                       "drop --namespace (a session keeps its namespace)")
    if args.session and getattr(args, "isolation", None):
        raise CliError("--isolation chooses a new session's level; a session keeps the one it was created with "
                       "(drop --isolation, or drop --session to start a new session)")
    if args.max_input_tokens is not None and not 1 <= args.max_input_tokens <= 2**53:
        raise CliError(f"--max-input-tokens must be a whole number of tokens from 1 to 2^53, not "
                       f"{args.max_input_tokens}")


def check_title(flag: str, value: str | None) -> None:
    """A session's title, or a text to search titles for: at most ``MAX_TITLE`` characters (the embedded CLI
    refuses a longer one as the API does; an empty one the flag's type refused already)."""
    if value is not None and len(value) > MAX_TITLE:
        raise CliError(f"{flag} takes at most {MAX_TITLE} characters, not {len(value)}; shorten it")


def run_env(items: list[str] | None) -> dict[str, str]:
    """``run --env KEY=VALUE ...`` as a mapping (``CliError`` on a malformed one)."""
    variables: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--env expects KEY=VALUE, got {item!r}")
        variables[key] = value
    return variables


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """``run``'s runtime_config: ``--scenario``, and each ``--config KEY=VALUE`` (a JSON value, else the text)."""
    runtime_config: dict[str, Any] = {}
    if args.scenario:
        runtime_config["scenario"] = args.scenario
    for item in args.config or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--config expects KEY=VALUE, got {item!r}")
        try:
            runtime_config[key] = json.loads(value)
        except json.JSONDecodeError:
            runtime_config[key] = value
    return runtime_config


def runtime_note(runtime: str, previous: str) -> str:
    """The runtime a task runs on, as the start line shows it: with the one it moves the session from."""
    return runtime if runtime == previous else f"{runtime} (the session moves from {previous})"


def read_again(args: argparse.Namespace, command: str, session_id: str) -> str:
    """The command that reads this session back: through the same ``--url``, or by the data dir (named when it is
    not the default one)."""
    if args.url and not getattr(args, "url_from_data_dir", False):
        return f"codesdk --url {args.url} {command} {session_id}"
    from pathlib import Path

    from ..config import default_data_dir

    data_dir = "" if Path(args.data_dir) == default_data_dir() else f"--data-dir {args.data_dir} "
    return f"codesdk {data_dir}{command} {session_id}"


def api_exit_code(status: int, code: str) -> int:
    """The exit code for an API refusal, as for the same refusal in-process (``cli.local.refusal_exit_code``)."""
    return EXIT_UNAVAILABLE if status in _UNAVAILABLE_STATUSES or code == "session_busy" else EXIT_USAGE


def exit_code(terminal_type: str | None, signum: int | None = None) -> int:
    """``run``'s exit code from how the task ended (``task.completed`` ...) or the signal that stopped it."""
    if signum is not None:
        return 128 + signum
    return {"task.completed": EXIT_OK, "task.stopped": EXIT_STOPPED}.get(str(terminal_type), EXIT_FAILED)


#: The terminal's answers to an approval: (allow, scope, what it says). Anything else is a no for this call.
TERMINAL_ANSWERS: dict[str, tuple[bool, str, str]] = {
    "y": (True, "once", "approved on the terminal"), "yes": (True, "once", "approved on the terminal"),
    "t": (True, "task", "approved on the terminal for the rest of the task"),
    "s": (True, "session", "approved on the terminal for the rest of the session"),
    "d": (False, "session", "denied on the terminal for the rest of the session"),
}
#: The question the terminal asks about an approval.
DECISION_PROMPT = "  Allow? [y]es once, [t]his task, [s]ession, [d]eny for the session, [N]o: "


#: Reads the line typed in answer to a prompt (written to stderr first); ``secret``: not echoed where stdin is a
#: terminal. None once stdin has ended. ``read_terminal``, or the typed lines' reader while it owns stdin.
LineReader = Callable[[str, bool], Awaitable[str | None]]


def _read_line(prompt: str, secret: bool) -> str | None:
    """One line from stdin (blocking: run in a thread)."""
    sys.stdout.flush()
    if secret and sys.stdin.isatty():
        try:
            return getpass.getpass(prompt, stream=sys.stderr)
        except EOFError:
            return None
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return sys.stdin.readline() or None


async def read_terminal(prompt: str, secret: bool = False) -> str | None:
    """``LineReader`` of stdin itself, for when nothing else reads it."""
    import trio  # here, not above: this module is imported before trio is (``front``), and trio is not light
    return await trio.to_thread.run_sync(_read_line, prompt, secret, abandon_on_cancel=True)


async def ask_decision_on_terminal(question: str, read: LineReader = read_terminal) -> tuple[bool, str, str]:
    """Ask about an approval on the terminal: (allow, scope, reason); the scopes of ``TERMINAL_ANSWERS`` (``t``,
    ``s``: a grant, docs/sessions.md), anything unknown a no for this call, a closed stdin a no."""
    answer = await read(question, False)
    if answer is None:
        return False, "once", "denied: stdin is closed"
    return TERMINAL_ANSWERS.get(answer.strip().lower(), (False, "once", "denied on the terminal"))


def add_store_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--store URL`` (default ``$CODESDK_STORE``): ``what`` says what it is for this command."""
    import os

    parser.add_argument("--store", default=os.environ.get("CODESDK_STORE") or None, metavar="URL",
                        help=f"{what}. Keep the password out of the command line (ps shows it): $CODESDK_STORE from "
                             "an EnvironmentFile, PGPASSWORD or ~/.pgpass")
