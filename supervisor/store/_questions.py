"""Questions a runtime asked its user, as stored: pending ones are listed and answered over the API; each is
settled exactly once (one conditional update, so two supervisors answering at once cannot both win).

Plain SQL both engines run (``_schema`` and ``_pg_schema`` create the ``questions`` table).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import Field

from codesdk.protocol import Answers, AnsweredVia, Model, QuestionRequested, QuestionState

from ._db import Db
from ._errors import StoreError
from ._time import from_text, now_text, to_text


class QuestionRecord(Model):
    """A runtime's question waiting for (or settled by) its user. ``ask_id``: the worker's own id for it (what
    ``runtime.sendAnswer`` names); ``question_id`` is the supervisor's."""

    question_id: str
    session_id: str
    task_id: str
    namespace: str
    ask_id: str
    request: QuestionRequested
    state: QuestionState
    created_at: datetime
    expires_at: datetime
    answered_at: datetime | None = None
    answered_via: AnsweredVia | None = None
    answered_by: str | None = None
    #: As stored: a secret question's answer redacted.
    answers: Answers = Field(default_factory=dict)
    reason: str | None = None


class UnknownQuestion(StoreError, LookupError):
    def __init__(self, question_id: str) -> None:
        self.question_id = question_id
        super().__init__(f"unknown question {question_id!r}")


class QuestionSettled(StoreError):
    """A question is answered (or declined) once; this one already was."""

    def __init__(self, question_id: str, state: QuestionState) -> None:
        self.question_id = question_id
        self.state = state
        super().__init__(f"question {question_id!r} is already {state}; an answer is final")


_COLUMNS = ("question_id, session_id, task_id, namespace, ask_id, request, state, created_at, expires_at, "
            "answered_at, answered_via, answered_by, answers, reason")


def _record(row: Sequence[Any]) -> QuestionRecord:
    (question_id, session_id, task_id, namespace, ask_id, request, state, created_at, expires_at, answered_at,
     answered_via, answered_by, answers, reason) = row
    return QuestionRecord(
        question_id=question_id, session_id=session_id, task_id=task_id, namespace=namespace, ask_id=ask_id,
        request=QuestionRequested.model_validate_json(request), state=QuestionState(state),
        created_at=from_text(created_at), expires_at=from_text(expires_at), answered_at=from_text(answered_at),
        answered_via=AnsweredVia(answered_via) if answered_via else None, answered_by=answered_by,
        answers=json.loads(answers) if answers else {}, reason=reason)


def insert_question(conn: Db, record: QuestionRecord) -> QuestionRecord:
    conn.execute(
        f"INSERT INTO questions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, NULL, NULL)",
        (record.question_id, record.session_id, record.task_id, record.namespace, record.ask_id,
         record.request.model_dump_json(exclude_none=True), QuestionState.PENDING.value,
         to_text(record.created_at), to_text(record.expires_at)))
    return select_question(conn, record.question_id)


def select_question(conn: Db, question_id: str) -> QuestionRecord:
    for row in conn.execute(f"SELECT {_COLUMNS} FROM questions WHERE question_id = ?", (question_id,)):
        return _record(row)
    raise UnknownQuestion(question_id)


def select_questions(conn: Db, state: QuestionState | None, namespaces: Sequence[str] | None,
                     task_id: str | None = None) -> list[QuestionRecord]:
    sql = f"SELECT {_COLUMNS} FROM questions"
    where: list[str] = []
    args: list[Any] = []
    if state is not None:
        where.append("state = ?")
        args.append(state.value)
    if namespaces is not None:
        where.append(f"namespace IN ({', '.join('?' for _ in namespaces) or 'NULL'})")
        args.extend(namespaces)
    if task_id is not None:
        where.append("task_id = ?")
        args.append(task_id)
    if where:
        sql += " WHERE " + " AND ".join(where)
    return [_record(row) for row in conn.execute(sql + " ORDER BY created_at, rowid", args)]


def settle_question(conn: Db, question_id: str, state: QuestionState, via: AnsweredVia, by: str,
                    answers: Answers, reason: str) -> QuestionRecord:
    """Pending -> answered/declined, exactly once (``QuestionSettled`` for a second answer)."""
    if state == QuestionState.PENDING:
        raise ValueError("a question is settled as answered or declined, not pending")
    settled = conn.scalar(
        "UPDATE questions SET state = ?, answered_at = ?, answered_via = ?, answered_by = ?, answers = ?, "
        "reason = ? WHERE question_id = ? AND state = ? RETURNING question_id",
        (state.value, now_text(), via.value, by, json.dumps(answers, ensure_ascii=False, allow_nan=False), reason,
         question_id, QuestionState.PENDING.value))
    if settled is None:
        raise QuestionSettled(question_id, select_question(conn, question_id).state)  # or UnknownQuestion
    return select_question(conn, question_id)


def extend_question(conn: Db, question_id: str, expires_at: datetime) -> QuestionRecord:
    """A pending question's deadline moved (routing gave it its whole timeout once someone could answer it); a
    settled one is left as it is."""
    conn.execute("UPDATE questions SET expires_at = ? WHERE question_id = ? AND state = ?",
                 (to_text(expires_at), question_id, QuestionState.PENDING.value))
    return select_question(conn, question_id)

#: The table, for SQLite (``_schema``) and PostgreSQL (``_pg_schema``, with its ``rowid`` identity column).
QUESTIONS_TABLE = """
        CREATE TABLE questions (
            {rowid}question_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(session_id),
            task_id TEXT NOT NULL REFERENCES tasks(task_id),
            namespace TEXT NOT NULL,
            ask_id TEXT NOT NULL,
            request TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'answered', 'declined')),
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            answered_at TEXT,
            answered_via TEXT CHECK (answered_via IN ('user', 'fallback', 'task_end', 'refused')),
            answered_by TEXT,
            answers TEXT,
            reason TEXT
        );
        CREATE INDEX questions_pending ON questions(state, namespace) WHERE state = 'pending';
        CREATE INDEX questions_by_task ON questions(task_id);
"""
