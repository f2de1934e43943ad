"""How the service is watched from outside: Prometheus metrics (``metrics``), OpenTelemetry traces (``tracing``,
with the ``otel`` extra) and the log's formats (``logs``). The engine tells them what happens through its
``Telemetry`` hooks; nothing here changes what the service does."""
