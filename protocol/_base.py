"""Shared base for contract models: frozen value types, validated at construction."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """Immutable, strict-about-unknown-fields contract model.

    ``extra="forbid"`` turns a misspelt field into a validation error instead of silently dropped data.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def to_json_obj(self) -> dict[str, Any]:
        """The wire form: JSON-compatible dict, ``None`` fields left out."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_json_obj(cls, obj: object) -> Self:
        return cls.model_validate(obj)
