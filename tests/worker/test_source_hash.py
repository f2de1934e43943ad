"""An implicit source's recorded hash: a regular file's content, never through a link anywhere on its path (a
workspace's ``CLAUDE.md -> /etc/shadow`` or ``.claude -> /root/secret`` must not hand a tenant a file's hash), never
a FIFO (which would block the worker) and never a file too large to read whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codesdk.protocol import sha256_hex
from codesdk.worker.adapters._source_hash import MAX_HASHED_BYTES, source_sha256


@settings(max_examples=30)
@given(content=st.binary(max_size=200_000))
def test_a_regular_files_hash_is_its_contents(tmp_path_factory: pytest.TempPathFactory, content: bytes) -> None:
    path = tmp_path_factory.mktemp("hashed") / "CLAUDE.md"
    path.write_bytes(content)
    assert source_sha256(path) == sha256_hex(content)


def test_links_pipes_folders_and_huge_files_get_no_hash(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("1234\n")
    link = tmp_path / "CLAUDE.md"
    link.symlink_to(secret)
    fifo = tmp_path / "AGENTS.md"
    os.mkfifo(fifo)
    huge = tmp_path / "GEMINI.md"
    with huge.open("wb") as f:
        f.truncate(MAX_HASHED_BYTES + 1)
    assert [source_sha256(p) for p in (link, fifo, tmp_path, huge, tmp_path / "gone")] == [None] * 5
    assert source_sha256(secret) == sha256_hex(b"1234\n")


def test_a_linked_folder_anywhere_on_the_path_gets_no_hash(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.mkdir()
    (secret / "settings.json").write_text('{"key": "hidden"}')
    workspace = tmp_path / "ws"
    (workspace / "deeper").mkdir(parents=True)
    (workspace / ".claude").symlink_to(secret)
    (workspace / "deeper" / "up").symlink_to(tmp_path)
    assert source_sha256(secret / "settings.json") == sha256_hex(b'{"key": "hidden"}')
    assert source_sha256(workspace / ".claude" / "settings.json") is None
    assert source_sha256(workspace / "deeper" / "up" / "root-only" / "settings.json") is None
    assert source_sha256(Path("relative/settings.json")) is None
