"""Webhooks: endpoints registered per namespace (or for every one, by the admin), sent signed deliveries from the
store's outbox by a loop of their own (docs/webhooks.md)."""

from ._registry import WebhookRegistry, url_refusal
from ._service import TooManyWebhooks, WebhookOptions, WebhookRefused, WebhookService

__all__ = ["TooManyWebhooks", "WebhookOptions", "WebhookRefused", "WebhookRegistry", "WebhookService", "url_refusal"]
