"""The CodeSDK worker: hosts runtime adapters and speaks line-delimited JSON-RPC 2.0 on stdio."""

#: This worker's version, as ``runtime.initialize`` reports it (and the Codex adapter names its client).
WORKER_VERSION = "0.1.0"
