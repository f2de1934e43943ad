"""What the worker tests share that the test kit does not give. A worker is driven with the kit's own driver,
``codesdk.testing.open_worker`` (docs/testing.md)."""

from __future__ import annotations

from pathlib import Path

#: The repository's root.
REPO = Path(__file__).resolve().parents[2]
