"""The compiled decoder of ``runtime.event`` lines: each worker line validated once, in msgspec, into bytes.

The supervisor's hot path (issue 35): a worker line becomes a ``WireEvent`` — the routing fields the engine
needs and the event's JSON (``event_json``), byte-equal to what pydantic would serialize from the model the
general path builds — without building a pydantic model. ``WireEvent.model()`` builds the model when Python
code asks for one (tool requests, terminal events).

One source of the schema: the msgspec Structs are generated at import from the pydantic models
(``protocol/_events.py``), field by field, and a model the generator cannot mirror exactly (a validator, an
alias, a type or a constraint it does not know) raises ``Unmirrorable``: its event type has no fast path
(``SLOW_EVENT_TYPES`` says why) and its lines take the general path. The mirror is exact for the lines a
worker writes (``encode_event``: compact, ``exclude_none``); it is stricter than the models elsewhere, and a
line it refuses takes the general path too:

- a field whose model default is not None is required (the worker always writes it), so the re-encoded event
  carries the same keys as the line; a field defaulting to None is left unset when absent and refuses ``null``;
- no coercion (``"n":"42"``, ``true`` for an int), ``time`` exactly as pydantic writes a UTC time;
- floats within ±1e16 (beyond, pydantic writes ``1e+16`` where msgspec writes ``1e16``).

Every guarantee of the strict decoder (``decode_json``) holds on this path, as research-35 §3 designed it:
duplicate keys are proven absent by counting keys in the line against the re-encoded event (msgspec keeps the
last of a duplicate), nesting is bounded by a byte pre-scan before msgspec recurses, non-finite numbers, too
many digits, lone surrogates and invalid UTF-8 are refused by msgspec itself (``raw`` is decoded as ``Any``,
never ``msgspec.Raw``, which would skip those checks).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, cast, get_args, get_origin

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ._base import Model
from ._events import WORKER_EVENT_MODELS, EventType, RuntimeInfo, WorkerEvent, _require_utc
from ._framing import MAX_NESTING_DEPTH
from ._jsonrpc import Method, RuntimeEventParams

__all__ = [
    "FAST_EVENT_TYPES",
    "SLOW_EVENT_TYPES",
    "Unmirrorable",
    "WireEvent",
    "decode_event_fast",
    "struct_for",
]


class Unmirrorable(TypeError):
    """A pydantic model (or one of its fields) that the Struct generator cannot mirror exactly."""


#: Beyond this magnitude pydantic and msgspec format floats differently (``1e+16`` / ``1e16``): not fast.
FLOAT_LIMIT = 1e16
#: A UTC time exactly as pydantic serializes one: no fraction, or six digits that are not all zeros.
#: (Checked in Python after the decode: as a msgspec ``Meta(pattern=…)`` it cost 0.48 µs per line, here 0.25.)
_TIME_SHAPE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.(?!000000)[0-9]{6})?Z").fullmatch
_STRUCT_OPTIONS: dict[str, Any] = {"forbid_unknown_fields": True, "frozen": True, "kw_only": True, "gc": False}

#: The constraints pydantic keeps in ``FieldInfo.metadata`` (annotated_types' classes, by name: that package is
#: pydantic's, not a dependency of ours) and msgspec's name for each; any other constraint is refused.
_CONSTRAINTS: dict[str, str] = {
    "Ge": "ge", "Gt": "gt", "Le": "le", "Lt": "lt", "MinLen": "min_length", "MaxLen": "max_length"}
_SCALARS = (str, int, bool)

_structs: dict[type[BaseModel], type[Struct]] = {}


def _check_plain(model: type[BaseModel], allow_validators: frozenset[str] = frozenset()) -> None:
    """Refuse a model whose validation or serialization is more than its fields' types and constraints."""
    config = model.model_config
    if config.get("extra") != "forbid":
        raise Unmirrorable(f"{model.__name__}: extra fields are not forbidden")
    decorators = model.__pydantic_decorators__
    if decorators.model_validators or decorators.root_validators:
        raise Unmirrorable(f"{model.__name__}: has a model validator")
    if decorators.model_serializers or decorators.field_serializers or decorators.computed_fields:
        raise Unmirrorable(f"{model.__name__}: has a custom serializer or a computed field")
    for name, validator in decorators.field_validators.items():
        if name not in allow_validators:
            raise Unmirrorable(f"{model.__name__}: field validator {name} on {', '.join(validator.info.fields)}")
    if config.get("alias_generator") is not None or config.get("strict") or config.get("coerce_numbers_to_str"):
        raise Unmirrorable(f"{model.__name__}: its config changes validation (aliases, strict, coercion)")


def _mirror_type(annotation: Any, where: str) -> Any:
    """The msgspec type for a pydantic annotation (None stripped from unions: the caller decides about null)."""
    if annotation is Any:
        return Any
    if isinstance(annotation, type):
        if issubclass(annotation, bool) or annotation in _SCALARS:
            return annotation
        if annotation is float:
            return Annotated[float, Meta(gt=-FLOAT_LIMIT, lt=FLOAT_LIMIT)]
        if issubclass(annotation, Enum) and issubclass(annotation, str):
            return annotation
        if issubclass(annotation, BaseModel):
            return struct_for(annotation)
        raise Unmirrorable(f"{where}: type {annotation.__name__} has no exact mirror")
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, UnionType):
        kept = [arg for arg in args if arg is not NoneType]
        if len(kept) != 1:
            raise Unmirrorable(f"{where}: a union of {annotation} has no exact mirror")
        return _mirror_type(kept[0], where)
    if origin is Literal:
        if not all(type(arg) is str for arg in args):
            raise Unmirrorable(f"{where}: a Literal of non-strings ({annotation}) has no exact mirror")
        return annotation
    if origin is dict and len(args) == 2 and args[0] is str:
        return dict[str, _mirror_type(args[1], where)]  # type: ignore[misc]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple[_mirror_type(args[0], where), ...]  # type: ignore[misc]
    if origin is list and len(args) == 1:
        return list[_mirror_type(args[0], where)]  # type: ignore[misc]
    raise Unmirrorable(f"{where}: annotation {annotation!r} has no exact mirror")


def _with_constraints(kind: Any, info: FieldInfo, where: str) -> Any:
    bounds: dict[str, Any] = {}
    for item in info.metadata:
        kind_of = type(item)
        key = _CONSTRAINTS.get(kind_of.__name__) if kind_of.__module__ == "annotated_types" else None
        if key is None:
            raise Unmirrorable(f"{where}: constraint {item!r} has no exact mirror")
        bounds[key] = getattr(item, key)
    if get_origin(kind) is Annotated and get_args(kind)[0] is float:  # merge with the float range
        if bounds.keys() & {"le", "lt"}:
            raise Unmirrorable(f"{where}: an upper bound on a float has no exact mirror")
        bounds["lt"] = FLOAT_LIMIT
        if not bounds.keys() & {"ge", "gt"}:
            bounds["gt"] = -FLOAT_LIMIT
        return Annotated[float, Meta(**bounds)]
    return Annotated[kind, Meta(**bounds)] if bounds else kind


def _field(model: type[BaseModel], name: str, info: FieldInfo) -> tuple[str, Any] | tuple[str, Any, Any]:
    where = f"{model.__name__}.{name}"
    if info.alias not in (None, name) or info.validation_alias not in (None, name) \
            or info.serialization_alias not in (None, name):
        raise Unmirrorable(f"{where}: has an alias")
    if info.exclude or info.discriminator is not None:
        raise Unmirrorable(f"{where}: excluded from serialization or discriminated")
    kind = _with_constraints(_mirror_type(info.annotation, where), info, where)
    if info.is_required() or info.default_factory is not None or info.default is not None:
        return (name, kind)  # a non-None default is always written by the worker: required here
    if kind is Any:  # an Any field defaulting to None: null and absent are the same to pydantic, not here
        raise Unmirrorable(f"{where}: an Any field defaulting to None")
    return (name, kind | UnsetType, UNSET)  # type: ignore[operator]


def struct_for(model: type[BaseModel]) -> type[Struct]:
    """The msgspec Struct mirroring ``model`` exactly (its fields in its order), or ``Unmirrorable``."""
    if model in _structs:
        return _structs[model]
    _check_plain(model)
    fields = [_field(model, name, info) for name, info in model.model_fields.items()]
    struct = msgspec.defstruct(model.__name__, fields, module=__name__, **_STRUCT_OPTIONS)
    _structs[model] = struct
    return struct


def _event_struct(event_type: EventType, model: type[WorkerEvent]) -> type[Struct]:
    """The tagged Struct of one worker event class: the envelope's fields in the model's order; ``type`` is the
    tag, ``time`` a UTC time as pydantic writes one (the model's only validator, ``_require_utc``, normalizes
    any other spelling), ``raw`` free-form and left unset when absent (an explicit null is declined)."""
    _check_plain(model, allow_validators=frozenset({"_utc"}))
    validators = model.__pydantic_decorators__.field_validators
    if "_utc" in validators and (validators["_utc"].func is not _require_utc
                                 or tuple(validators["_utc"].info.fields) != ("time",)):
        raise Unmirrorable(f"{model.__name__}: its time validator is not _require_utc")
    expected = ["type", "time", "runtime", "payload", "raw"]
    if list(model.model_fields) != expected:
        raise Unmirrorable(f"{model.__name__}: envelope fields {list(model.model_fields)} are not {expected}")
    payload = model.model_fields["payload"]
    if payload.metadata or not (isinstance(payload.annotation, type) and issubclass(payload.annotation, Model)):
        raise Unmirrorable(f"{model.__name__}.payload: not one plain model")
    time = model.model_fields["time"]
    if time.annotation is not datetime or time.metadata:
        raise Unmirrorable(f"{model.__name__}.time: not a plain datetime")
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        ("time", str),  # its shape is checked after the decode (_valid_time)
        ("runtime", struct_for(model.model_fields["runtime"].annotation)),  # type: ignore[arg-type]
        ("payload", struct_for(payload.annotation)),
        ("raw", Any, UNSET),
    ]
    return msgspec.defstruct(model.__name__ + "Wire", fields, module=__name__, tag_field="type",
                             tag=event_type.value, **_STRUCT_OPTIONS)


def _build() -> tuple[dict[EventType, type[Struct]], dict[EventType, str]]:
    fast: dict[EventType, type[Struct]] = {}
    slow: dict[EventType, str] = {}
    for event_type, model in WORKER_EVENT_MODELS.items():
        try:
            fast[event_type] = _event_struct(event_type, model)
        except Unmirrorable as refused:
            slow[event_type] = str(refused)
    return fast, slow


_EVENT_STRUCTS, _SLOW = _build()
#: Worker event types decoded by the compiled decoder; the others always take the general path.
FAST_EVENT_TYPES: frozenset[EventType] = frozenset(_EVENT_STRUCTS)
#: Why each other worker event type has no fast path (the generator's refusal).
SLOW_EVENT_TYPES: Mapping[EventType, str] = _SLOW

_Params = msgspec.defstruct("RuntimeEventParams", [
    ("task_id", str), ("n", Annotated[int, Meta(ge=1)]),
    ("event", Union[tuple(_EVENT_STRUCTS.values())]),  # type: ignore[misc]  # noqa: UP007
], module=__name__, **_STRUCT_OPTIONS)
_EventLine = msgspec.defstruct("EventLine", [
    ("jsonrpc", Literal["2.0"]), ("method", Literal["runtime.event"]), ("params", _Params),
], module=__name__, **_STRUCT_OPTIONS)
assert Method.EVENT.value == "runtime.event"


def _untyped_float(text: str) -> float:
    """A float in free-form JSON (``raw``, ``input`` …): finite and within the range both encoders agree on."""
    value = float(text)
    if not -FLOAT_LIMIT < value < FLOAT_LIMIT:  # also inf from an overflowing literal (NaN cannot be written)
        raise ValueError("float beyond the fast path's range")
    return value


_DECODER = msgspec.json.Decoder(_EventLine, float_hook=_untyped_float)
_ENCODER = msgspec.json.Encoder()
_ENVELOPE_KEYS = 6  # jsonrpc, method, params, task_id, n, event


def _valid_time(text: str) -> bool:
    """``text`` is a UTC time exactly as pydantic writes one, and a real calendar time (pydantic refuses
    2026-02-30 and 25:00)."""
    if _TIME_SHAPE(text) is None:
        return False
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


class WireEvent(tuple[str, int, EventType, bytes, Any, list[Any]]):
    """One worker event as bytes plus the fields the engine routes on; the pydantic model only when asked.

    Built by ``decode_event_fast`` (from a proven line) or ``WireEvent.from_params`` (from the general path's
    model), so both paths yield the same type. Immutable: a tuple (built in one step, ~0.1 µs, where setting
    slots one by one cost 1.4 µs per event) whose routing fields are read, when asked, from the msgspec Struct
    or the model; what is serialized or built on demand is kept in its private cache."""

    __slots__ = ()

    def __new__(cls, task_id: str, n: int, event_type: EventType, event_json: bytes, struct: Any,
                model: RuntimeEventParams | None = None) -> WireEvent:
        return tuple.__new__(cls, (task_id, n, event_type, event_json, struct, [model, None, None]))

    def __repr__(self) -> str:
        return f"WireEvent(task_id={self[0]!r}, n={self[1]}, type={self[2].value!r})"

    def __eq__(self, other: object) -> bool:  # the event, not what was cached or how it was decoded
        if not isinstance(other, WireEvent):
            return NotImplemented
        return self[0] == other[0] and self[1] == other[1] and self[3] == other[3]

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self[0], self[1], self[3]))

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as its model (a Struct class is made here, not importable)
        return (WireEvent.from_params, (self.model(),))

    @classmethod
    def from_params(cls, params: RuntimeEventParams) -> WireEvent:
        """The general path's model as a WireEvent (its JSON serialized once, here)."""
        event = params.event
        event_json = event.__pydantic_serializer__.to_json(event, exclude_none=True)
        return cls(params.task_id, params.n, EventType(event.type), event_json, None, params)

    @property
    def task_id(self) -> str:
        return self[0]

    @property
    def n(self) -> int:
        return self[1]

    @property
    def type(self) -> EventType:
        return self[2]

    @property
    def event_json(self) -> bytes:
        """The event (type, time, runtime, payload, raw if present), as pydantic's ``to_json(exclude_none=True)``
        of the model the general path builds."""
        return self[3]

    @property
    def struct(self) -> Struct | None:
        """The msgspec Struct of the event, or None when it came from the general path."""
        return cast(Struct | None, self[4])

    @property
    def time(self) -> str:
        """The event's time, as pydantic writes it (``2026-11-28T13:41:46.517154Z``)."""
        struct = self[4]
        if struct is not None:
            return cast(str, struct.time)
        event_json = self[3]  # {"type":"…","time":"…",… as pydantic wrote it (an EventType holds no quote)
        start = event_json.index(b'"time":"') + 8
        return event_json[start:event_json.index(b'"', start)].decode()

    @property
    def runtime_name(self) -> str:
        struct = self[4]
        return cast(str, struct.runtime.name) if struct is not None else self.model().event.runtime.name

    @property
    def runtime_model(self) -> str | None:
        struct = self[4]
        if struct is None:
            return self.model().event.runtime.model
        value = struct.runtime.model
        return None if value is UNSET else cast(str, value)

    @property
    def runtime_session_id(self) -> str | None:
        struct = self[4]
        if struct is None:
            return self.model().event.runtime.runtime_session_id
        value = struct.runtime.runtime_session_id
        return None if value is UNSET else cast(str, value)

    @property
    def tool_call_id(self) -> str | None:
        """The payload's ``tool_call_id``, when its type has one."""
        struct = self[4]
        payload = struct.payload if struct is not None else self.model().event.payload
        return cast(str | None, getattr(payload, "tool_call_id", None))

    @property
    def has_raw(self) -> bool:
        """Whether the event carries the runtime's own message(s) (``raw``)."""
        struct = self[4]
        return struct.raw is not UNSET if struct is not None else self.model().event.raw is not None

    @property
    def payload_json(self) -> bytes:
        """The payload, as pydantic serializes it (``exclude_none``): the same bytes as inside ``event_json``."""
        cache = self[5]
        cached: bytes | None = cache[1]
        if cached is None:
            struct = self[4]
            if struct is not None:
                cached = _ENCODER.encode(struct.payload)
            else:
                payload = self.model().event.payload
                cached = payload.__pydantic_serializer__.to_json(payload, exclude_none=True)
            cache[1] = cached
        return cached

    @property
    def runtime_json(self) -> bytes:
        """The runtime info, as pydantic serializes it (``exclude_none``)."""
        cache = self[5]
        cached: bytes | None = cache[2]
        if cached is None:
            struct = self[4]
            if struct is not None:
                cached = _ENCODER.encode(struct.runtime)
            else:
                runtime = self.model().event.runtime
                cached = RuntimeInfo.__pydantic_serializer__.to_json(runtime, exclude_none=True)
            cache[2] = cached
        return cached

    def model(self) -> RuntimeEventParams:
        """The pydantic model, equal to what the general path builds from the same line (built once, on demand:
        validated by pydantic-core from ``event_json``, bytes this module wrote)."""
        cache = self[5]
        cached: RuntimeEventParams | None = cache[0]
        if cached is None:
            body = b"".join((b'{"task_id":', _ENCODER.encode(self[0]), b',"n":', str(self[1]).encode(),
                             b',"event":', self[3], b"}"))
            cached = RuntimeEventParams.model_validate_json(body)
            cache[0] = cached
        return cached




def _key_bound(line: bytes, colons: int) -> int:
    """How many keys ``line`` can hold at most: its ``colons`` (``":``) minus those whose quote is escaped, i.e.
    preceded by an odd run of backslashes (runs of at least k backslashes, for k = 1, 2 …, alternate in sign)."""
    bound = colons
    run, sign = b"\\", -1
    while count := line.count(run + b'":'):
        bound += sign * count
        run, sign = run + b"\\", -sign
    return bound


def decode_event_fast(line: bytes) -> WireEvent | None:
    """The ``runtime.event`` line as a WireEvent — or None when the line is not *proven* valid: the caller then
    takes the general path (``decode_json``, then ``RuntimeEventParams``).

    A line this accepts is one the general path accepts, and ``event_json`` / ``model()`` equal what it builds
    (a property test holds it to that). Never raises."""
    # Tabs and line breaks never occur raw inside a JSON string, so outside one they are whitespace; a space
    # before a colon would hide a key from the count below: not tried.
    if b"\t" in line or b"\r" in line or b"\n" in line or b" :" in line:
        return None
    # 201 nested arrays or objects need 402 bytes: a shorter line cannot pass the nesting limit.
    if len(line) > 2 * MAX_NESTING_DEPTH and line.count(b"[") + line.count(b"{") > MAX_NESTING_DEPTH:
        return None
    try:
        params: Any = cast(Any, _DECODER.decode(line)).params
    except (msgspec.DecodeError, ValueError, RecursionError):  # ValueError: UnicodeDecodeError, the float hook
        return None
    event = params.event
    raw = event.raw
    if raw is None:  # an explicit null: pydantic leaves it out of the event, msgspec would write it
        return None
    time = event.time
    if not _valid_time(time):
        return None
    body = _ENCODER.encode(event)
    # Duplicate keys: the re-encoded event has exactly one key per distinct key of the line's objects (every
    # field present in the line is set, none absent from it is, and msgspec keeps one of a duplicate); the
    # line's ``":`` bound its keys from above. Equal counts leave no room for a duplicate.
    colons = body.count(b'":')
    distinct = _ENVELOPE_KEYS + (colons if b"\\" not in body else _key_bound(body, colons))
    bound = line.count(b'":')
    if bound != distinct and _key_bound(line, bound) != distinct:
        return None
    return WireEvent(params.task_id, params.n, _TAGS[type(event)], body, event)


_TAGS: dict[type[Struct], EventType] = {struct: event_type for event_type, struct in _EVENT_STRUCTS.items()}
