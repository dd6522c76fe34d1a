"""``RequestOutput``: what one engine step tells about one request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestOutput:
    """One request after a step: the tokens and text it added, and all of them so far.

    ``new_text`` never splits a UTF-8 character and holds back text that may be the start
    of a stop string, until the next tokens tell; the pieces joined are ``text``.
    ``finish_reason``: "stop" (end-of-sequence id, stop token id or stop string: the
    string is cut from the text), "length" (``max_tokens``) or "abort".  Times are
    ``time.monotonic()`` seconds.
    """

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    token_ids: list[int]
    new_text: str
    text: str
    finished: bool
    finish_reason: str | None
    arrival_time: float
    first_token_time: float | None
    finished_time: float | None
