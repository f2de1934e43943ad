"""The CodeSDK supervisor: event store, worker pool, task engine, owned tools, CLI."""
