"""The CodeSDK contract, sans-IO: models, JSON-RPC messages, line framing, canonical hashing.

Everything here is pure (no trio, no sockets, no sqlite, no subprocess) so both the supervisor and
workers, and drivers written for tests, share one definition. Private modules hold the code; this
module is the public surface.
"""

from ._base import Model
from ._canonical import (
    HASH_PREFIX,
    CanonicalizationError,
    canonical_hash,
    canonical_json,
    is_hash,
    sha256_hex,
)
from ._events import (
    PAYLOAD_MODELS,
    TERMINAL_EVENT_TYPES,
    WORKER_EVENT_TYPES,
    BlockKind,
    EventType,
    ModelInput,
    ModelOutputCompleted,
    ModelOutputDelta,
    NormalizedEvent,
    PolicyDecision,
    PolicySource,
    RuntimeInfo,
    RuntimeRequestCompleted,
    RuntimeRequestStarted,
    SandboxSummary,
    SessionCreated,
    TaskCompleted,
    TaskFailed,
    TaskFailureCode,
    TaskStarted,
    TaskStopped,
    ToolCallApproved,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallPolicyEvaluated,
    ToolCallRequested,
    ToolCallStarted,
    ToolOutputCompleted,
    ToolOutputDelta,
    Trace,
    UpcasterRegistry,
    UsageReported,
    WorkerEvent,
    parse_payload,
    upcasters,
    utc_now,
)
from ._framing import (
    DEFAULT_MAX_FRAME_BYTES,
    BadFrame,
    FrameProblem,
    LineFramer,
    MessageReader,
    decode_json,
    decode_message,
    encode_message,
)
from ._jsonrpc import (
    Ack,
    ErrorCode,
    ErrorObject,
    ErrorResponse,
    GetAuthStatusParams,
    InitializeParams,
    InitializeResult,
    InvalidMessage,
    JsonRpcMessage,
    Method,
    Notification,
    PeerInfo,
    Request,
    RequestId,
    Response,
    RuntimeEventParams,
    RuntimeOffer,
    SendToolDeniedParams,
    SendToolResultParams,
    SessionRef,
    StartTaskParams,
    StartTaskResult,
    StopParams,
    TraceContext,
    error_response,
    parse_message,
)
from ._runtime import (
    AuthState,
    AuthStatus,
    CancellationSupport,
    InteractionMode,
    IsolationLevel,
    IsolationMode,
    PermissionMode,
    RuntimeCapabilities,
    RuntimeEnv,
    ToolRouting,
)
from ._tools import ExecutedBy, ToolCallIdentity, ToolClass, ToolManifest, ToolSpec
from ._transcript import (
    CodeBlock,
    ContentBlock,
    Message,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from ._versions import CONTRACT_VERSION, PROTOCOL_VERSION, SCHEMA_VERSION

__all__ = [name for name in dir() if not name.startswith("_")]
