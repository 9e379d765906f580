"""The HTTP edge: the OpenAI-compatible app, its routes, request bodies and their checks, API
keys, answers and server-sent events, the status page."""
