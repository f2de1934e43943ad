"""The CodeSDK worker: hosts runtime adapters and speaks line-delimited JSON-RPC 2.0 on stdio."""
