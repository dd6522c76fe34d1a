"""Server-sent events as OpenAI's streaming responses frame them: one ``data: {json}``
event per chunk, each ended by a blank line, and ``data: [DONE]`` last."""

from __future__ import annotations

import json
from typing import Any

#: The last event of every stream.
DONE = "data: [DONE]\n\n"
#: The response's media type.
MEDIA_TYPE = "text/event-stream"


def event(payload: dict[str, Any]) -> str:
    """One event carrying ``payload`` as compact JSON (JSON escapes newlines, so the
    payload is one ``data:`` line)."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
