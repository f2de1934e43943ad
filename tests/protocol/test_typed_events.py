"""Events typed by ``type``, the typed method table, and the request rules the worker applies."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from codesdk.protocol import (
    EVENT_MODELS,
    INVALID_REQUEST_DATA,
    METHOD_TABLE,
    PAYLOAD_MODELS,
    WORKER_EVENT_MODELS,
    WORKER_EVENT_TYPES,
    Ack,
    AnyEvent,
    ApprovalRequested,
    AuthStatus,
    EventType,
    IncomingRequest,
    InvalidMessage,
    Method,
    ModelOutputDelta,
    ModelOutputDeltaEvent,
    ModelOutputDeltaWorkerEvent,
    NoParams,
    NormalizedEvent,
    Rpc,
    RuntimeEventParams,
    SandboxKind,
    SandboxSummary,
    StartTaskResult,
    TaskFailed,
    TaskFailedEvent,
    TaskFailureCode,
    TaskStopped,
    TaskStoppedEvent,
    ToolCallRequestedEvent,
    ToolClass,
    Trace,
    WorkerEvent,
    parse_event,
    parse_event_json,
    parse_request,
    parse_worker_event,
    upcasters,
)

_T = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _stored(event_type: EventType, payload: Any) -> dict[str, Any]:
    return {"seq": 3, "time": "2026-01-02T03:04:05Z", "type": event_type.value, "trace": {"session_id": "s"},
            "runtime": {"name": "scripted"}, "payload": payload}


# --- one class per type -----------------------------------------------------------------------------


def test_every_type_has_its_class_and_every_worker_type_its_worker_class() -> None:
    assert set(EVENT_MODELS) == set(EventType) and set(WORKER_EVENT_MODELS) == WORKER_EVENT_TYPES
    for event_type, cls in EVENT_MODELS.items():
        assert issubclass(cls, NormalizedEvent) and cls.model_fields["payload"].annotation is PAYLOAD_MODELS[event_type]
    for event_type, worker_cls in WORKER_EVENT_MODELS.items():
        assert (issubclass(worker_cls, WorkerEvent)
                and worker_cls.model_fields["payload"].annotation is PAYLOAD_MODELS[event_type])


def test_constructing_validating_and_constructing_unchecked_all_give_the_class_of_the_type() -> None:
    payload = ModelOutputDelta(block_id="b", delta="hi")
    built = NormalizedEvent(seq=3, time=_T, type=EventType.MODEL_OUTPUT_DELTA, trace=Trace(session_id="s"),
                            runtime={"name": "scripted"}, payload={"block_id": "b", "delta": "hi"})
    validated = NormalizedEvent.model_validate(_stored(EventType.MODEL_OUTPUT_DELTA, payload.to_json_obj()))
    from_json = NormalizedEvent.model_validate_json(built.model_dump_json())
    unchecked = NormalizedEvent.model_construct(seq=3, time=_T, type=EventType.MODEL_OUTPUT_DELTA,
                                                trace=Trace(session_id="s"), runtime=built.runtime, payload=payload)
    for event in (built, validated, from_json, unchecked, parse_event(built.to_json_obj()),
                  parse_event_json(built.model_dump_json()), upcasters.load(built.to_json_obj())):
        assert type(event) is ModelOutputDeltaEvent and event.payload == payload
    assert built == validated == from_json == unchecked
    assert unchecked.model_dump_json() == built.model_dump_json()
    worker = WorkerEvent(type="model.output.delta", runtime={"name": "scripted"}, payload=payload)
    assert type(worker) is ModelOutputDeltaWorkerEvent
    assert type(parse_worker_event(worker.to_json_obj())) is ModelOutputDeltaWorkerEvent


def test_a_field_annotated_with_a_base_validates_as_the_union() -> None:
    class Page(BaseModel):
        events: list[NormalizedEvent]

    page = Page.model_validate({"events": [_stored(EventType.TASK_STOPPED, {}),
                                           _stored(EventType.TASK_FAILED, {"code": "X", "message": "m"})]})
    assert [type(e) for e in page.events] == [TaskStoppedEvent, TaskFailedEvent]
    assert json.loads(page.model_dump_json())["events"][1]["payload"]["code"] == "X"


def test_the_payload_narrows_with_the_type() -> None:
    event = parse_event(_stored(EventType.TOOL_CALL_REQUESTED, {"tool_call_id": "c", "input_hash": "h",
                                                               "tool_name": "workspace.read", "input": {"p": 1}}))
    if event.type == EventType.TOOL_CALL_REQUESTED:  # the checker narrows ``event`` (and its payload) here
        assert event.payload.tool_name == "workspace.read"
    assert isinstance(event, ToolCallRequestedEvent)


def test_a_payload_with_only_defaults_may_be_left_out_and_others_may_not() -> None:
    assert parse_event(_stored(EventType.TASK_STOPPED, {})).payload == TaskStopped()
    stored = _stored(EventType.TASK_STOPPED, {})
    del stored["payload"]
    assert parse_event(stored).payload == TaskStopped()
    with pytest.raises(ValidationError):
        parse_event({k: v for k, v in _stored(EventType.MODEL_OUTPUT_DELTA, {}).items() if k != "payload"})


def test_unknown_types_and_mismatched_payloads_are_refused() -> None:
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        NormalizedEvent.model_validate(_stored(EventType.TASK_STOPPED, {}) | {"type": "task.exploded"})
    with pytest.raises(ValidationError):
        NormalizedEvent(seq=1, time=_T, type="task.exploded", trace={"session_id": "s"}, runtime={"name": "x"},
                        payload={})
    with pytest.raises(ValidationError):
        NormalizedEvent(seq=1, time=_T, type=EventType.TASK_FAILED, trace={"session_id": "s"},
                        runtime={"name": "x"}, payload=ModelOutputDelta(block_id="b", delta="d"))
    with pytest.raises(ValidationError, match="emitted by the supervisor"):
        WorkerEvent(type=EventType.TOOL_CALL_APPROVED, runtime={"name": "x"},
                    payload={"tool_call_id": "c", "input_hash": "h", "source": "codesdk"})


def test_times_are_normalized_to_utc_in_every_class() -> None:
    event = WorkerEvent(type=EventType.TASK_STOPPED, time=datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
                        runtime={"name": "x"}, payload=TaskStopped())
    assert event.time == datetime(2026, 1, 1, tzinfo=UTC) and event.time.tzinfo is UTC


@given(st.sampled_from(sorted(EventType)), st.data())
@settings(max_examples=100)
def test_the_wire_form_is_the_one_of_the_untyped_envelope(event_type: EventType, data: st.DataObject) -> None:
    """Same keys, same order, same values as before the envelope was typed: stored rows and lines do not change."""
    payload = data.draw(st.builds(PAYLOAD_MODELS[event_type]))
    event = NormalizedEvent(seq=1, time=_T, type=event_type, trace={"session_id": "s"}, runtime={"name": "x"},
                            payload=payload)
    dumped = json.loads(event.model_dump_json(exclude_none=True))
    assert list(dumped) == ["schema_version", "seq", "time", "type", "trace", "runtime", "payload"]
    assert dumped["payload"] == json.loads(payload.model_dump_json(exclude_none=True))


def test_events_copy_pickle_and_hash_as_their_class() -> None:
    event = parse_event(_stored(EventType.TASK_FAILED, {"code": "RATE_LIMITED", "message": "m"}))
    assert pickle.loads(pickle.dumps(event)) == event and type(pickle.loads(pickle.dumps(event))) is TaskFailedEvent
    assert type(event.model_copy(update={"seq": 9})) is TaskFailedEvent
    stopped = parse_event(_stored(EventType.TASK_STOPPED, {}))  # (a dict in a payload makes an event unhashable)
    assert hash(stopped) == hash(stopped.model_copy())


def test_the_any_event_annotation_works_in_a_model() -> None:
    class Holder(BaseModel):
        event: AnyEvent

    assert type(Holder.model_validate({"event": _stored(EventType.TASK_STOPPED, {})}).event) is TaskStoppedEvent


# --- enums where strings were --------------------------------------------------------------------


def test_known_failure_codes_become_members_and_runtime_codes_stay_strings() -> None:
    assert TaskFailed(code="RATE_LIMITED", message="m").code is TaskFailureCode.RATE_LIMITED
    assert TaskFailed.model_validate_json('{"code":"OVERLOADED","message":"m"}').code is TaskFailureCode.OVERLOADED
    own = TaskFailed(code="MY_RUNTIME_BROKE", message="m")
    assert own.code == "MY_RUNTIME_BROKE" and not isinstance(own.code, TaskFailureCode)
    assert json.loads(TaskFailed(code=TaskFailureCode.TIMEOUT, message="m").model_dump_json())["code"] == "TIMEOUT"


def test_sandbox_kinds_and_tool_classes_are_enums() -> None:
    assert SandboxSummary(kind="subprocess").kind is SandboxKind.SUBPROCESS
    with pytest.raises(ValidationError):
        SandboxSummary(kind="vm")
    approval = ApprovalRequested(tool_call_id="c", input_hash="h", approval_id="a", tool_name="t", tool_class="write",
                                 reason="r", expires_at=_T)
    assert approval.tool_class is ToolClass.WRITE


# --- the method table ---------------------------------------------------------------------------


def test_the_table_names_every_request_with_its_params_and_result() -> None:
    assert set(METHOD_TABLE) == {m.value for m in Method} - {Method.EVENT.value}
    for name, spec in METHOD_TABLE.items():
        assert spec.method == name and issubclass(spec.params, BaseModel) and issubclass(spec.result, BaseModel)
    assert Rpc.START_TASK.result is StartTaskResult and Rpc.GET_AUTH_STATUS.result is AuthStatus
    assert Rpc.SHUTDOWN.params is NoParams and not Rpc.SHUTDOWN.takes_params and Rpc.STOP.takes_params
    assert Rpc.STOP.parse_result({"ok": True}) == Ack()
    with pytest.raises(ValidationError):
        Rpc.START_TASK.parse_result({"accepted": True})


# --- the request rules (§1.4) ---------------------------------------------------------------------

_BASE = {"jsonrpc": "2.0", "method": "runtime.stop"}


@pytest.mark.parametrize(("obj", "expected"), [
    (_BASE | {"id": 1, "params": {"task_id": "t"}}, IncomingRequest("runtime.stop", {"task_id": "t"}, 1)),
    (_BASE | {"id": "r", "params": []}, IncomingRequest("runtime.stop", [], "r")),
    (_BASE | {"id": None}, IncomingRequest("runtime.stop", None, None)),
    (_BASE | {"id": 1.5}, IncomingRequest("runtime.stop", None, 1.5)),
    (_BASE, IncomingRequest("runtime.stop", None, None, notification=True)),
])
def test_requests_that_follow_the_rules(obj: dict[str, Any], expected: IncomingRequest) -> None:
    assert parse_request(obj) == expected


@pytest.mark.parametrize(("obj", "readable"), [
    (_BASE | {"id": 1, "params": None}, 1), (_BASE | {"id": 1, "params": "x"}, 1), (_BASE | {"id": 1, "x": 0}, 1),
    ({"jsonrpc": "1.0", "method": "m", "id": "r"}, "r"), ({"jsonrpc": 2.0, "method": "m", "id": "r"}, "r"),
    ({"method": "m", "id": "r"}, "r"), ({"jsonrpc": "2.0", "id": "r"}, "r"),
    ({"jsonrpc": "2.0", "method": 5, "id": 2}, 2),
    (_BASE | {"id": True}, None), (_BASE | {"id": {}}, None), (_BASE | {"id": [1]}, None),
    ({"jsonrpc": "2.0", "id": "r", "result": 1}, "r"), ([], None), (5, None), (None, None), ("x", None),
])
def test_objects_that_break_them_carry_the_id_when_it_is_readable(obj: Any, readable: Any) -> None:
    problem = parse_request(obj)
    assert isinstance(problem, InvalidMessage) and problem.id == readable


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                                                       max_size=3), max_leaves=8)
members = st.dictionaries(st.sampled_from(["jsonrpc", "method", "id", "params", "other"]),
                          st.sampled_from(["2.0", "runtime.stop"]) | json_values, max_size=5)


@given(members | json_values)
def test_parse_request_is_total_and_accepts_exactly_the_rule_abiding(obj: Any) -> None:
    result = parse_request(obj)
    follows = (isinstance(obj, dict) and set(obj) <= {"jsonrpc", "method", "id", "params"}
               and obj.get("jsonrpc") == "2.0" and isinstance(obj.get("method"), str)
               and ("id" not in obj or obj["id"] is None or (type(obj["id"]) in (int, float, str)))
               and ("params" not in obj or isinstance(obj["params"], (dict, list))))
    assert isinstance(result, IncomingRequest) == follows
    if isinstance(result, IncomingRequest):
        assert (result.method, result.params, result.id, result.notification) == (
            obj["method"], obj.get("params"), obj.get("id"), "id" not in obj)


def test_the_invalid_request_data_is_the_documented_sentence() -> None:
    assert INVALID_REQUEST_DATA == "The request failed schema validation"


def test_runtime_event_params_hold_the_class_of_the_type() -> None:
    params = RuntimeEventParams.model_validate({"task_id": "t", "n": 1, "event": {
        "type": "model.output.delta", "runtime": {"name": "x"}, "payload": {"block_id": "b", "delta": "d"}}})
    assert type(params.event) is ModelOutputDeltaWorkerEvent
