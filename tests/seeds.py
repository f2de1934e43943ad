"""Seeds of randomised tests: fresh on each run unless one is given, and named in any failure, so that the
failing run can be replayed exactly."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Seed:
    """A randomised test's seed and the environment variable that replays it."""

    env_var: str
    value: int

    @classmethod
    def from_env(cls, env_var: str) -> Seed:
        """The seed ``env_var`` gives (a replay), else a fresh one."""
        given = os.environ.get(env_var)
        return cls(env_var, int(given) if given else random.randrange(1 << 30))

    @property
    def replay(self) -> str:
        return f"replay with {self.env_var}={self.value}"

    @contextmanager
    def rng(self) -> Iterator[random.Random]:
        """The test's only source of randomness; whatever fails inside (an assertion, a hang guard) carries the
        seed as a note, which pytest prints with the failure."""
        try:
            yield random.Random(self.value)
        except BaseException as exc:
            exc.add_note(self.replay)
            raise
