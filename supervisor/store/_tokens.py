"""API tokens as the database keeps them (PostgreSQL, ``_pg_tokens``): rows of hashes and principals' fields.

What a token means (its principal, who may do what) is the API's business (``api._auth``); the store keeps rows
and announces each change on ``TOKENS_CHANNEL``, so every supervisor reading them can refresh its view at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

#: The channel each change of the token table is announced on, in the changing transaction (payload: the ids).
TOKENS_CHANNEL = "codesdk_tokens"


@dataclass(frozen=True)
class TokenRow:
    """One token: its id, its principal's fields and the sha256 of the token (never the token)."""

    token_id: str
    name: str
    sha256: str
    admin: bool = False
    metrics: bool = False
    namespaces: tuple[str, ...] = ()


class Listening(Protocol):
    """A listener for the table's announcements (run it in a nursery; ``stop`` ends it)."""

    listening: bool

    async def run(self) -> None: ...

    def stop(self) -> None: ...


class TokenTable(Protocol):
    """The tokens a database keeps (``open_token_table``). Blocking: call it from a thread in a trio program."""

    location: str

    def rows(self) -> list[TokenRow]: ...

    def edit(self, change: Callable[[list[TokenRow]], list[TokenRow]]) -> list[TokenRow]: ...

    def import_rows(self, rows: list[TokenRow],
                    refuse: Callable[[list[TokenRow], TokenRow], str | None]) -> list[tuple[TokenRow, str]]: ...

    def listener(self, changed: Callable[[], None]) -> Listening: ...

    def close(self) -> None: ...
