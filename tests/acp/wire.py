"""Every line ``codesdk acp`` wrote, checked against ACP's stable schema (``fixtures/acp/schema-v1.21.0.json``, as
published by agentclientprotocol/agent-client-protocol) and against the official Python SDK's models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from acp import schema as sdk

SCHEMA = Path(__file__).resolve().parents[2] / "fixtures" / "acp" / "schema-v1.21.0.json"

#: What answers each client request, and what each of our requests and notifications carries: schema definition
#: and SDK model.
RESULTS = {"initialize": ("InitializeResponse", sdk.InitializeResponse),
           "authenticate": ("AuthenticateResponse", sdk.AuthenticateResponse),
           "session/new": ("NewSessionResponse", sdk.NewSessionResponse),
           "session/load": ("LoadSessionResponse", sdk.LoadSessionResponse),
           "session/resume": ("ResumeSessionResponse", sdk.ResumeSessionResponse),
           "session/list": ("ListSessionsResponse", sdk.ListSessionsResponse),
           "session/prompt": ("PromptResponse", sdk.PromptResponse),
           "session/set_config_option": ("SetSessionConfigOptionResponse", sdk.SetSessionConfigOptionResponse)}
PARAMS = {"session/update": ("SessionNotification", sdk.SessionNotification),
          "session/request_permission": ("RequestPermissionRequest", sdk.RequestPermissionRequest),
          "elicitation/create": ("CreateElicitationRequest", sdk.CreateFormSessionElicitationRequest),
          "$/cancel_request": ("CancelRequestNotification", sdk.CancelRequestNotification)}


def validator(definition: str) -> jsonschema.protocols.Validator:
    root = json.loads(SCHEMA.read_text())
    return jsonschema.Draft202012Validator({"$defs": root["$defs"], "$ref": f"#/$defs/{definition}"})


def check_log(log: Path) -> dict[str, int]:
    """Check each line the agent wrote; how many of each kind were checked. An AssertionError names the first
    line that is not ACP."""
    asked: dict[Any, str] = {}
    counts: dict[str, int] = {}
    validators: dict[str, jsonschema.protocols.Validator] = {}

    def check(definition: str, model: Any, value: Any, line: str) -> None:
        found = validators.setdefault(definition, validator(definition))
        errors = list(found.iter_errors(value))
        assert not errors, f"{definition}: {errors[0].message} at {list(errors[0].absolute_path)} in {line}"
        model.model_validate(value)
        counts[definition] = counts.get(definition, 0) + 1

    for record in map(json.loads, log.read_text().splitlines()):
        message = json.loads(record["line"])
        if record["dir"] == "in":
            if "method" in message and "id" in message:
                asked[message["id"]] = message["method"]
            continue
        assert message.get("jsonrpc") == "2.0", record["line"]
        if "method" in message:
            definition, model = PARAMS[message["method"]]
            check(definition, model, message["params"], record["line"])
        elif "error" in message:
            check("Error", sdk.Error, message["error"], record["line"])
        else:
            definition, model = RESULTS[asked[message["id"]]]
            check(definition, model, message["result"], record["line"])
    return counts
