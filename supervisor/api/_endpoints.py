"""The API's one route table: the app routes from it (``create_app``) and the OpenAPI document is generated from it
(``openapi_document``), so the two cannot list different operations, parameters or answers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel

from codesdk.protocol import api


class Access(StrEnum):
    PUBLIC = "public"  # no token (probes, the API's own description)
    TOKEN = "token"  # any tenant's token or the admin's; a tenant sees only its namespaces
    ADMIN = "admin"  # the admin token only (403 for a tenant's)
    METRICS = "metrics"  # the admin token or a metrics token (``token add --metrics``): what Prometheus holds


#: What every status means, in the document.
STATUS_MEANS = {
    400: "the request is malformed (not JSON, bad framing)",
    401: "missing or invalid bearer token",
    403: "the token may not do this",
    404: "unknown, or another tenant's (never told apart)",
    408: "the request body did not arrive in time",
    409: "conflicts with the resource's state (the message says which)",
    413: "the request body is larger than 1 MiB",
    421: "the namespace is served by another supervisor (details name it)",
    422: "invalid request: the message names the field and what it takes",
    402: "the namespace spent its monthly budget (details: spent, limit, when it resets)",
    429: "a limit of the token or the namespace is reached (Retry-After where it passes by itself)",
    416: "the Range asks for no byte of it (Content-Range says its size)",
    500: "a fault of the service (its log says more)",
    503: "the service cannot do it now (store failing, shutting down, runtime or disk unavailable)",
}


@dataclass(frozen=True)
class Endpoint:
    """One operation of the API."""

    method: str
    path: str
    #: The stable name a generated client gives the call.
    operation_id: str
    summary: str
    tag: str
    access: Access
    #: The success answer's JSON model, or None where the body is not JSON (``media_type``).
    answer: type[BaseModel] | None
    status: int = 200
    body: type[api.Request] | None = None
    query: type[api.Query] | None = None
    #: Error statuses this operation answers beyond those of its access (401, 403) and of every route (429 for a
    #: token over its connections, 500, 503 for a failing store).
    errors: tuple[int, ...] = ()
    media_type: str = "application/json"
    description: str = ""
    #: Other answers that are not errors: (status, what it means); 206 carries part of the success body.
    also: tuple[tuple[int, str], ...] = ()
    #: Request headers it reads: (name, what for).
    headers: tuple[tuple[str, str], ...] = ()

    def error_statuses(self) -> tuple[int, ...]:
        common = {500, 503}
        if self.access is not Access.PUBLIC:
            common |= {401, 429}
        if self.access is not Access.PUBLIC:
            common.add(403)  # a metrics token anywhere but /metrics; a tenant's on an admin route
        if self.body is not None:
            common |= {400, 408, 413, 422}
        if self.query is not None:
            common.add(422)
        if self.method == "POST":  # an Idempotency-Key reused for another request, or still being answered
            common |= {409, 422}
        return tuple(sorted(common | set(self.errors)))


_SESSION = "/v1/sessions/{session_id}"
_NAMESPACE = "/v1/namespaces/{namespace}"
_SSE = ("A `text/event-stream`: each stored event as `id: <seq>`, `event: <type>`, `data: <NormalizedEvent JSON>`; "
        "comment lines keep the connection alive. Reconnect with the `Last-Event-ID` header (or `after_seq`) to "
        "resume without a gap or a repeat. A last `event: error` frame (`data: {\"error\": {\"code\", \"message\"}}`) "
        "says why the service ended the stream: `token_revoked` (the token was revoked, rotated or no longer covers "
        "the namespace: reconnecting is refused), `tokens_unavailable` or `store_failing` (reconnect later).")

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/healthz", "getHealth", "Liveness: the process answers", "service", Access.PUBLIC, api.Health),
    Endpoint("GET", "/readyz", "getReadiness",
             "Readiness: the store is open and takes writes, the disk reserve is free", "service", Access.PUBLIC,
             api.Readiness),
    Endpoint("GET", "/metrics", "getMetrics", "Prometheus metrics", "service", Access.METRICS, None,
             media_type="text/plain",
             description="The Prometheus text format. Read with a metrics token (`codesdk-supervisor token add NAME "
                         "--metrics`), which may read nothing else, so that Prometheus never holds the admin's; also "
                         "served alone on `serve --metrics-port` (127.0.0.1)."),
    Endpoint("POST", "/v1/sessions", "createSession", "Create a session in one of your namespaces", "sessions",
             Access.TOKEN, api.Session, 201, body=api.CreateSessionRequest, errors=(403, 404, 409, 421, 429),
             description="`isolation` chooses where its runtime keeps its HOME (`namespaced`, the default; "
                         "`ephemeral`; `shared`): 409 `isolation_refused` for `shared` on a multi-user service or "
                         "outside namespace `default`."),
    Endpoint("GET", "/v1/sessions", "listSessions", "Your sessions, oldest first (not the archived, unless asked)", "sessions", Access.TOKEN,
             api.SessionList, query=api.SessionsQuery),
    Endpoint("GET", _SESSION, "getSession", "One session", "sessions", Access.TOKEN, api.Session, errors=(404,)),
    Endpoint("PATCH", _SESSION, "updateSession", "Retitle, archive or unarchive a session, or replace its metadata",
             "sessions", Access.TOKEN, api.Session, body=api.UpdateSessionRequest, errors=(404,),
             description="An archived session is left out of listings (`state=archived` or `all` shows it) and kept "
                         "whole: its events, blobs and workspace stay, and a task may still be started in it."),
    Endpoint("DELETE", _SESSION, "deleteSession", "Delete a session: its events, tasks and the blobs only it held",
             "sessions", Access.TOKEN, api.DeletedSession, errors=(404, 409, 421),
             description="Refused (409 `session_busy`) while one of its tasks is pending or running: stop it first. "
                         "Removes its events, tasks and approvals, the blobs no other session holds, and its default "
                         "workspace unless a fork still works in it (an operator's workspace is never removed). "
                         "What it stored no longer counts against the namespace's quotas. Written to the service's "
                         "audit log."),
    Endpoint("POST", f"{_SESSION}/fork", "forkSession", "Fork a session at an event into a new one", "sessions",
             Access.TOKEN, api.Session, 201, body=api.ForkSessionRequest, errors=(404, 409, 421, 429),
             description="The new session, in the same namespace and on the same runtime, starts with copies of the "
                         "session's events up to `at_seq`: its transcript is the conversation up to there, and its "
                         "next task's runtime is given that transcript as a new conversation of its own. The session "
                         "forked from is left as it is (it may be busy). 422 `fork_inside_task` when `at_seq` falls "
                         "inside a task (`details` names the seqs around it)."),
    Endpoint("POST", f"{_SESSION}/tasks", "startTask", "Start a task: the session's next prompt", "tasks",
             Access.TOKEN, api.Task, 202, body=api.StartTaskRequest, errors=(402, 404, 409, 421, 429),
             description="Answers once the task is stored (state `pending`); follow it on the session's events. "
                         "409 `session_busy` while another task of the session is active; 409 `budget_paused` "
                         "while the session is paused at its budget (raise it first); 402 `monthly_budget_spent` "
                         "once the namespace spent its monthly budget.",
             headers=(("traceparent", "a W3C trace context: the task's spans join that trace, and its events' "
                                      "`trace.request_id` is its trace id (unless X-Request-Id is sent)"),
                      ("X-Request-Id", "stored as every event's `trace.request_id` (1 to 200 visible ASCII)"),
                      ("X-Client-Id", "stored as every event's `trace.client_id` (1 to 200 visible ASCII)"))),
    Endpoint("GET", f"{_SESSION}/budget", "getSessionBudget", "A session's budget: limits, spent, and whether it is "
             "paused waiting for a raise", "sessions", Access.TOKEN, api.SessionBudgetView, errors=(404,)),
    Endpoint("PUT", f"{_SESSION}/budget", "setSessionBudget", "Replace a session's budget limits", "sessions",
             Access.TOKEN, api.SessionBudgetView, body=api.SetBudgetRequest, errors=(404, 421),
             description="A paused session stays paused: `POST .../budget/raise` ends a pause."),
    Endpoint("POST", f"{_SESSION}/budget/raise", "raiseSessionBudget",
             "Raise a paused session's budget, and optionally go on with the work in a new task", "sessions",
             Access.TOKEN, api.RaisedBudget, body=api.RaiseBudgetRequest, errors=(402, 404, 409, 421, 429),
             description="409 `budget_not_paused` when the session is not paused at its budget. Stores "
                         "`budget.raised`; with `continue` a task of the session is started (202 semantics: "
                         "follow it on the events) with the stopped task's modes and runtime config."),
    Endpoint("GET", f"{_SESSION}/events", "listEvents", "Stored events, paged by after_seq and limit", "events",
             Access.TOKEN, api.EventPage, query=api.EventsQuery, errors=(404,)),
    Endpoint("GET", f"{_SESSION}/events/stream", "streamEvents", "Live events (Server-Sent Events)", "events",
             Access.TOKEN, None, query=api.StreamQuery, errors=(404,), media_type="text/event-stream",
             description=_SSE),
    Endpoint("GET", f"{_SESSION}/transcript", "getTranscript", "The conversation derived from the session's events",
             "sessions", Access.TOKEN, api.Transcript, errors=(404,)),
    Endpoint("GET", f"{_SESSION}/bundle", "getSupportBundle",
             "The session's support bundle (.tar.gz, secrets redacted)", "sessions", Access.TOKEN, None,
             errors=(404,), media_type="application/gzip"),
    Endpoint("GET", f"{_SESSION}/blobs/{{ref}}", "getBlob", "Download a blob the session's events name", "sessions",
             Access.TOKEN, None, errors=(404, 416), media_type="application/octet-stream",
             description="`ref` is a `sha256:<hex>` the session's events carry in a ref field (`result_ref`, "
                         "`input_ref`, `runtime.raw_ref` …; the hex alone works too). The answer's `Content-Type` is "
                         "the blob's own; its `ETag` is its hash, so it never changes. A blob the session does not "
                         "name is 404, as is another tenant's session.",
             also=((206, "Part of it: the Range asked for (Content-Range says which)"),
                   (304, "Not modified: If-None-Match holds its ETag")),
             headers=(("Range", "one byte range, `bytes=first-last`, `bytes=first-` or `bytes=-suffix`"),
                      ("If-None-Match", "its ETag: 304 instead of the bytes"),
                      ("If-Range", "its ETag: the Range holds only if the blob is still this one"))),
    Endpoint("GET", "/v1/tasks/{task_id}", "getTask", "One task", "tasks", Access.TOKEN, api.Task, errors=(404,)),
    Endpoint("POST", "/v1/tasks/{task_id}/stop", "stopTask", "Stop a task: task.stopped at once, with a receipt",
             "tasks", Access.TOKEN, api.StoppedTask, body=api.StopTaskRequest, errors=(404, 409, 421)),
    Endpoint("POST", "/v1/tasks/{task_id}/input", "sendTaskInput", "Add a message to a running task (steering)",
             "tasks", Access.TOKEN, api.TaskInput, 202, body=api.TaskInputRequest, errors=(404, 409, 421),
             description="The runtime takes it into the turn it is running (`mid_turn`: at its next model request) "
                         "or queues it (`queued`: a runtime that cannot steer); an input it has not taken when the "
                         "task ends opens the session's next task's prompt. `model.input.appended` records when it "
                         "was delivered. 409 `task_not_active` unless the task is running; 422 for an empty input or "
                         "an `input_id` the session has used."),
    Endpoint("GET", "/v1/approvals", "listApprovals", "Tool calls waiting for a decision (or ?state=)", "approvals",
             Access.TOKEN, api.ApprovalList, query=api.ApprovalsQuery),
    Endpoint("POST", "/v1/approvals/decisions", "decideApprovals", "Decide several approvals at once", "approvals",
             Access.TOKEN, api.DecisionResults, body=api.DecisionsRequest, errors=(421,),
             description="For parallel calls: each decision is applied on its own and answered with the status the "
                         "single call would have had (200 with the approval, or 404, 409 `already_decided`, 422 "
                         "naming the field), in the request's order; one that fails leaves the others applied."),
    Endpoint("POST", "/v1/approvals/{approval_id}", "decideApproval", "Decide an approval, once", "approvals",
             Access.TOKEN, api.Approval, body=api.DecisionRequest, errors=(404, 409, 421),
             description="`scope` other than `once` also makes a grant that decides the session's later calls it "
                         "covers (docs/sessions.md, \"Scoped grants\"); `input` runs the call with an edited input. "
                         "422 naming the field for a pattern or an input that cannot apply to the call."),
    Endpoint("GET", f"{_SESSION}/grants", "listGrants", "The session's grants, active and revoked, oldest first",
             "approvals", Access.TOKEN, api.GrantList, errors=(404,)),
    Endpoint("DELETE", f"{_SESSION}/grants/{{grant_id}}", "revokeGrant", "Revoke a grant: it decides nothing after",
             "approvals", Access.TOKEN, api.Grant, errors=(404, 409, 421),
             description="Stored as `grant.revoked` in the session's events. 409 `already_revoked` for a grant "
                         "revoked before; 404 for one the session does not have."),
    Endpoint("GET", "/v1/questions", "listQuestions", "Runtimes' questions waiting for an answer (or ?state=)",
             "questions", Access.TOKEN, api.AskedQuestionList, query=api.QuestionsQuery),
    Endpoint("GET", "/v1/questions/{question_id}", "getQuestion", "One question a runtime asked", "questions",
             Access.TOKEN, api.AskedQuestion, errors=(404,)),
    Endpoint("POST", "/v1/questions/{question_id}", "answerQuestion", "Answer (or decline) a question, once",
             "questions", Access.TOKEN, api.AskedQuestion, body=api.AnswerRequest, errors=(404, 409, 421, 422),
             description="`answers` is keyed by question id; each answer is checked against its question (one of "
                         "its choices, a list of them with `multi_select`, text, or a value its schema allows). A "
                         "bad answer is 422 naming the field (`answers.<id>`); a second answer is 409; another "
                         "tenant's question is 404."),
    Endpoint("GET", "/v1/runtimes", "listRuntimes",
             "The runtimes a namespace's worker can host (default: the token's own namespace)", "runtimes",
             Access.TOKEN, api.RuntimeList, query=api.RuntimesQuery, errors=(404, 421)),
    Endpoint("GET", "/v1/me", "getMe", "Who the token is: its name, whether it is the admin, its namespaces",
             "namespaces", Access.TOKEN, api.Me, query=api.NoQuery),
    Endpoint("GET", "/v1/namespaces", "listNamespaces", "The namespaces the token sees, with session counts",
             "namespaces", Access.TOKEN, api.NamespaceList, query=api.NoQuery),
    Endpoint("GET", f"{_NAMESPACE}/auth/{{runtime}}", "getLoginState", "A runtime's login state in a namespace",
             "runtimes", Access.TOKEN, api.LoginState, errors=(404, 421, 422)),
    Endpoint("GET", f"{_NAMESPACE}/runtime-env", "getRuntimeEnv",
             "What a namespace's worker runs with: folders, variable names, identity, implicit sources",
             "namespaces", Access.TOKEN, api.RuntimeEnvView, query=api.RuntimeEnvQuery, errors=(404, 421, 422)),
    Endpoint("GET", "/v1/workers", "listWorkers", "Every namespace's worker: state, crashes, quarantine", "service",
             Access.ADMIN, api.WorkerList),
    Endpoint("DELETE", f"{_NAMESPACE}/quarantine", "liftQuarantine", "Let a quarantined namespace start workers now",
             "namespaces", Access.ADMIN, api.QuarantineLifted, errors=(422,)),
    Endpoint("GET", "/v1/tokens", "listTokens", "Every API token: id, name, role and namespaces (never the token)",
             "tokens", Access.ADMIN, api.TokenList, query=api.NoQuery),
    Endpoint("POST", "/v1/tokens", "createToken", "Make a token bound to namespaces (or a metrics token)", "tokens",
             Access.ADMIN, api.IssuedToken, 201, body=api.CreateTokenRequest, errors=(409,),
             description="`secret` is the token, shown this once: only its hash is kept. 409 `token_name_taken` when "
                         "a token of that name is bound to one of the namespaces. Written to the audit log."),
    Endpoint("DELETE", "/v1/tokens/{token_id}", "revokeToken", "Revoke a token: it stops working at once",
             "tokens", Access.ADMIN, api.TokenInfo, errors=(404, 409),
             description="Its console sessions end with it. 409 `admin_token` for the admin's own token (changed "
                         "on the host: `codesdk-supervisor token rotate`)."),
    Endpoint("POST", "/v1/tokens/{token_id}/rotate", "rotateToken",
             "Replace a token by a new one (same id, name and namespaces)", "tokens", Access.ADMIN, api.IssuedToken,
             errors=(404, 409),
             description="The old token stops working at once; `secret` is the new one, shown this once. 409 "
                         "`admin_token` for the admin's own token."),
    Endpoint("GET", f"{_NAMESPACE}/env", "getNamespaceEnv", "A namespace's variables: names and fingerprints",
             "namespaces", Access.ADMIN, api.EnvList, errors=(422,)),
    Endpoint("PATCH", f"{_NAMESPACE}/env", "updateNamespaceEnv",
             "Set or unset a namespace's variables, for its next worker", "namespaces", Access.ADMIN, api.EnvList,
             body=api.EnvUpdateRequest),
    Endpoint("GET", f"{_NAMESPACE}/egress", "getNamespaceEgress",
             "A namespace's http.fetch hosts: the operator's, and its own narrowing of them", "namespaces",
             Access.ADMIN, api.NamespaceEgress, errors=(422,)),
    Endpoint("PUT", f"{_NAMESPACE}/egress", "setNamespaceEgress",
             "Narrow (never widen) the operator's http.fetch hosts for a namespace", "namespaces", Access.ADMIN,
             api.NamespaceEgress, body=api.EgressUpdateRequest),
    Endpoint("GET", f"{_NAMESPACE}/budget", "getNamespaceBudget",
             "A namespace's monthly budget (USD) and what it spent this month", "namespaces", Access.ADMIN,
             api.NamespaceBudget, errors=(422,)),
    Endpoint("PUT", f"{_NAMESPACE}/budget", "setNamespaceBudget",
             "Set a namespace's monthly budget (USD; null: none)", "namespaces", Access.ADMIN, api.NamespaceBudget,
             body=api.NamespaceBudgetRequest,
             description="Once its sessions spent it in a calendar month (UTC), new tasks there are refused with "
                         "402 `monthly_budget_spent` until the month ends."),
    Endpoint("POST", "/v1/webhooks", "createWebhook", "Register a webhook endpoint (its secret is shown once)",
             "webhooks", Access.TOKEN, api.WebhookCreated, 201, body=api.CreateWebhookRequest,
             errors=(403, 409, 503),
             description="The URL's host must be one the operator allows (`serve --webhook-allow`, and "
                         "`--webhook-allow-address` for a non-public address), and a request can be made to it (its "
                         "path and query visible ASCII): 422 naming `url` otherwise. A tenant's webhook is of its own "
                         "namespace (403 for another's, as for sessions); the admin's of "
                         "one namespace, or of every namespace when `namespace` is left out. Deliveries are signed "
                         "the Standard Webhooks way with the secret answered here (docs/webhooks.md). 409 "
                         "`too_many_webhooks` past 20 per namespace."),
    Endpoint("GET", "/v1/webhooks", "listWebhooks", "The webhooks the token sees", "webhooks", Access.TOKEN,
             api.WebhookList, query=api.NoQuery, errors=(503,)),
    Endpoint("GET", "/v1/webhooks/{webhook_id}", "getWebhook", "One webhook", "webhooks", Access.TOKEN, api.Webhook,
             errors=(404, 503)),
    Endpoint("DELETE", "/v1/webhooks/{webhook_id}", "deleteWebhook",
             "Remove a webhook and the deliveries not yet sent", "webhooks", Access.TOKEN, None, 204,
             errors=(404, 503)),
    Endpoint("POST", "/v1/webhooks/{webhook_id}/rotate", "rotateWebhookSecret",
             "A new secret; the previous one still signs beside it for a while", "webhooks", Access.TOKEN,
             api.RotatedSecret, body=api.RotateWebhookSecretRequest, errors=(404, 409, 503),
             description="Until `previous_valid_until` each delivery carries two signatures (one per secret), so the "
                         "receiver may switch to the new secret at any time in between. Rotating again before then "
                         "is 409 `rotation_overlaps` unless `end_overlap` is true, which stops the earlier secret "
                         "signing at once (at most two secrets sign)."),
    Endpoint("POST", "/v1/webhooks/{webhook_id}/test", "testWebhook", "Send a `webhook.test` delivery", "webhooks",
             Access.TOKEN, api.DeliveryAnswer, 202, errors=(404, 503)),
    Endpoint("GET", "/v1/webhooks/{webhook_id}/deliveries", "listDeliveries",
             "A webhook's deliveries, newest first (or ?state=pending|delivered|dead)", "webhooks", Access.TOKEN,
             api.DeliveryList, query=api.DeliveriesQuery, errors=(404, 503),
             description="A page of at most `limit` (default 100); when `has_more`, the next page is asked with "
                         "`before` = `next_before`."),
    Endpoint("GET", "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}", "getDelivery",
             "One delivery, with its attempts", "webhooks", Access.TOKEN, api.Delivery, errors=(404, 503)),
    Endpoint("POST", "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver", "redeliverDelivery",
             "Send a delivery again, with the same id", "webhooks", Access.TOKEN, api.DeliveryAnswer, 202,
             errors=(404, 503),
             description="Due at once, whatever its state; it keeps its id (the `webhook-id` header), so a receiver "
                         "that already has it may drop it, and its attempts so far."),
    Endpoint("GET", "/v1/openapi.json", "getOpenApi", "This document", "service", Access.PUBLIC, None),
    Endpoint("GET", "/v1/docs", "getApiReference", "This document as a web page", "service", Access.PUBLIC, None,
             media_type="text/html"),
)
