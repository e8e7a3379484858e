"""The OpenAI-compatible HTTP API, as a plain ASGI app over a `CompletionService`."""
