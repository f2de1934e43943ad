"""Contract models: JSON round trips, validation, upcasting."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from codesdk.protocol import (
    PAYLOAD_MODELS,
    SCHEMA_VERSION,
    AuthStatus,
    EventType,
    InitializeResult,
    Message,
    Model,
    NormalizedEvent,
    RuntimeCapabilities,
    RuntimeEnv,
    RuntimeEventParams,
    StartTaskParams,
    TaskStoppedEvent,
    ToolManifest,
    UpcasterRegistry,
    WorkerEvent,
    check_runtime_name,
    is_runtime_name,
)

text = st.text(max_size=30)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_:", min_size=1, max_size=20)
times = st.datetimes(timezones=st.just(UTC))


def _payload(model: type[Model]) -> st.SearchStrategy[Model]:
    return st.builds(model)


@st.composite
def normalized_events(draw: st.DrawFn) -> NormalizedEvent:
    event_type = draw(st.sampled_from(list(EventType)))
    payload = draw(st.builds(PAYLOAD_MODELS[event_type]))
    return NormalizedEvent(
        seq=draw(st.integers(1, 2**40)), time=draw(times), type=event_type,
        trace={"session_id": draw(ids), "task_id": draw(st.none() | ids)},
        runtime={"name": draw(ids), "model": draw(st.none() | text)}, payload=payload,
    )


@given(normalized_events())
def test_normalized_event_round_trips_through_json(event: NormalizedEvent) -> None:
    assert NormalizedEvent.model_validate_json(event.model_dump_json()) == event
    assert NormalizedEvent.model_validate(event.to_json_obj()) == event


@given(st.builds(StartTaskParams, runtime=ids, task_id=ids,
                 session=st.builds(dict, session_id=ids), messages=st.lists(st.builds(Message), max_size=3)))
def test_start_task_params_round_trip(params: StartTaskParams) -> None:
    assert StartTaskParams.model_validate(params.to_json_obj()) == params


@given(st.builds(RuntimeCapabilities, name=ids, version=text), st.builds(AuthStatus, runtime=ids),
       st.builds(RuntimeEnv, namespace=ids, home=text), st.builds(ToolManifest))
def test_runtime_models_round_trip(caps: RuntimeCapabilities, auth: AuthStatus, env: RuntimeEnv,
                                   manifest: ToolManifest) -> None:
    for model in (caps, auth, env, manifest):
        assert type(model).model_validate_json(model.model_dump_json()) == model


def test_event_payload_must_match_its_type() -> None:
    with pytest.raises(ValidationError):
        NormalizedEvent.model_validate({"seq": 1, "time": "2026-01-01T00:00:00Z", "type": "task.failed",
                                        "trace": {"session_id": "s"}, "runtime": {"name": "x"},
                                        "payload": {"delta": "hi", "block_id": "b"}})


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        WorkerEvent(type="task.completed", time=datetime(2026, 1, 1), runtime={"name": "x"}, payload={})


def test_worker_may_not_send_supervisor_events() -> None:
    with pytest.raises(ValidationError, match="emitted by the supervisor"):
        RuntimeEventParams.model_validate({"task_id": "t", "n": 1, "event": {
            "type": "tool.call.approved", "runtime": {"name": "x"},
            "payload": {"tool_call_id": "c", "input_hash": "h", "source": "codesdk"}}})


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs"):
        InitializeResult.model_validate({"protocol_version": "1.0", "worker": {"name": "w", "version": "1"},
                                         "pid": 1, "runtimes": [], "surprise": True})


def test_upcaster_walks_old_versions_forward() -> None:
    registry = UpcasterRegistry(current=3)

    @registry.register(1)
    def rename_kind(raw: dict[str, Any]) -> dict[str, Any]:
        raw["payload"]["delta"] = raw["payload"].pop("text")
        return raw

    @registry.register(2)
    def add_index(raw: dict[str, Any]) -> dict[str, Any]:
        raw["payload"].setdefault("index", 0)
        return raw

    old = {"schema_version": 1, "payload": {"block_id": "b", "text": "hi"}}
    assert registry.upcast(old) == {"schema_version": 3, "payload": {"block_id": "b", "delta": "hi", "index": 0}}
    with pytest.raises(ValueError, match="newer than this build"):
        registry.upcast({"schema_version": 4})
    with pytest.raises(ValueError, match="not older"):
        registry.register(3)


def test_current_schema_loads_without_upcasting() -> None:
    raw = {"schema_version": SCHEMA_VERSION, "seq": 1, "time": "2026-01-01T00:00:00+00:00", "type": "task.stopped",
           "trace": {"session_id": "s"}, "runtime": {"name": "x"}, "payload": {}}
    event = UpcasterRegistry().load(raw)
    assert isinstance(event, TaskStoppedEvent) and event.payload.reason == "stop requested"


def test_every_runtime_the_worker_hosts_has_a_name_the_rule_allows() -> None:
    """One rule for what a runtime may be called (the API and the engine both check it): every adapter's name must
    pass it, or that runtime could never be asked for."""
    from codesdk.worker.adapters.registry import default_registry

    names = sorted(default_registry().adapters)
    assert {"scripted", "claude", "codex", "codex-acp", "gemini", "opencode"} <= set(names)
    assert [name for name in names if not is_runtime_name(name)] == []


@pytest.mark.parametrize("name", ["", "Claude", "../claude", "-x", ".hidden", "x" * 65, "claude\n", "a b", 7, None])
def test_what_is_no_runtime_name_is_refused_in_words(name: object) -> None:
    assert not is_runtime_name(name)
    if isinstance(name, str):
        with pytest.raises(ValueError, match=r"not a runtime name: .* \(a runtime's name is lowercase letters"):
            check_runtime_name(name)
