"""Fixtures the reliability suite shares with the API suite."""

from __future__ import annotations

from tests.api.conftest import api

__all__ = ["api"]  # the real API on a unix socket, with two tenants (a fixture)
