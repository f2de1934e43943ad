"""The arguments of ``codesdk approvals``, ``decide``, ``grants`` and ``revoke`` (``decisions`` runs them).

Imported by ``front`` before the heavy imports: the standard library only."""

from __future__ import annotations

from typing import Any

#: ``GrantScope``'s values (here without importing the protocol; a test holds them equal).
SCOPES = ("once", "task", "session", "rule")


def add_parsers(command: Any) -> None:
    """The four commands, on ``front``'s ``command(name, help)``."""
    approvals = command("approvals", "tool calls waiting for a decision (through the service that runs them)")
    approvals.add_argument("--state", default="pending", choices=["pending", "approved", "denied", "expired", "all"])
    approvals.add_argument("--json", action="store_true")

    decide = command("decide", "decide one or more pending approvals (several: one request, each answered on its "
                               "own); --scope makes a grant for later calls")
    decide.add_argument("verdict", choices=["allow", "deny"],
                        help="allow: let the call run; deny: refuse it (the runtime is told the reason)")
    decide.add_argument("approval", nargs="+", help="approval id(s), as `codesdk approvals` lists them")
    decide.add_argument("--reason", help="why (shown to the runtime on a denial)")
    decide.add_argument("--scope", choices=SCOPES, default="once",
                        help="once (default): this call; task: this tool for the rest of the task; session: for the "
                             "session; rule: for the session where the input matches --path, --command or --host")
    rule = decide.add_mutually_exclusive_group()
    rule.add_argument("--path", metavar="PREFIX", help="--scope rule: paths at or under PREFIX (workspace-relative)")
    rule.add_argument("--command", dest="command_prefix", metavar="WORDS", help="--scope rule: commands whose argv begins with WORDS "
                                                         "(split on spaces: 'git status')")
    rule.add_argument("--host", help="--scope rule: URLs on HOST (or *.HOST for its subdomains)")
    decide.add_argument("--input", metavar="JSON", help="allow: run the call with this input instead (a JSON "
                                                        "object, checked as the tool checks any input)")
    decide.add_argument("--json", action="store_true", help="print each decision's result as JSON")

    grants = command("grants", "a session's grants: what scoped decisions allow or deny without asking")
    grants.add_argument("session")
    grants.add_argument("--json", action="store_true")

    revoke = command("revoke", "revoke a grant of a session: from now on it decides nothing")
    revoke.add_argument("session")
    revoke.add_argument("grant", help="the grant's id, as `codesdk grants SESSION` lists it")
    revoke.add_argument("--json", action="store_true")
