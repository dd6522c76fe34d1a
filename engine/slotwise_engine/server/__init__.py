"""``slotwise serve``'s OpenAI-compatible HTTP server over the asynchronous engine.

The modules: :mod:`.app` builds the FastAPI application and its routes,
:mod:`.protocol` holds the OpenAI request and response schemas, :mod:`.errors` the
error format, :mod:`.metrics` the Prometheus exposition, :mod:`.sse` the
server-sent-event framing of streamed responses.  FastAPI and uvicorn come with the
``slotwise-engine[serve]`` extra; nothing here is imported without them.
"""
