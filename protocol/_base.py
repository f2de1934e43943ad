"""Shared base for contract models: frozen value types, validated at construction."""

from __future__ import annotations

from inspect import Signature
from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class _SignatureWhenAsked:
    """A deferred model's ``inspect.signature``: pydantic sets one only once the model is built, so this builds it
    when asked and introspection (``hypothesis.strategies.builds``, help()) still sees the fields. Each class gets
    its own (see ``Model.__pydantic_init_subclass__``); building the class replaces it with pydantic's."""

    def __get__(self, instance: object, owner: type[BaseModel]) -> Signature:
        if instance is not None:  # class-only, as pydantic's own: an instance's signature is its __call__'s
            raise AttributeError("'__signature__' is class-only")
        if not owner.__pydantic_complete__:
            owner.model_rebuild()
        if owner.__dict__.get("__signature__") is self:  # could not be built: what its __init__ takes
            return Signature.from_callable(owner.__init__)
        return owner.__signature__


class Model(BaseModel):
    """Immutable, strict-about-unknown-fields contract model.

    ``extra="forbid"`` turns a misspelt field into a validation error instead of silently dropped data.
    ``defer_build``: a model's validator and serializer are built when it is first used, not at import — building
    them all cost every process ~0.1 s of its start (a worker uses a handful of the ~100 models before its first
    task; measured for the cold start, docs/performance.md case 8).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, defer_build=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not cls.__pydantic_complete__:
            cls.__signature__ = _SignatureWhenAsked()  # type: ignore[assignment]

    def to_json_obj(self) -> dict[str, Any]:
        """The wire form: JSON-compatible dict, ``None`` fields left out."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_json_obj(cls, obj: object) -> Self:
        return cls.model_validate(obj)
