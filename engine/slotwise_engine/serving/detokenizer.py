"""``Detokenizer``: one request's text as its tokens arrive, cut at its stop strings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotwise_engine.serving.stop_strings import find_stop, held_back

if TYPE_CHECKING:
    from slotwise_engine.models.tokenizer import Tokenizer


class Detokenizer:
    """Turns a request's tokens into text, one token at a time.

    The tokenizer's ``StreamDecoder`` releases complete characters only (a byte-level
    token may end inside one); its pieces are searched for the request's stop strings
    (across token boundaries), the text is cut where the first one begins, and text that
    may still grow into a stop string is held back from ``take_new`` until it cannot.
    Without a tokenizer the text stays empty.
    """

    def __init__(self, tokenizer: Tokenizer | None, stop: tuple[str, ...] = ()) -> None:
        self._decoder = None if tokenizer is None else tokenizer.stream()
        self._stop = stop
        #: The text so far, cut before the first stop string.
        self.text = ""
        #: Whether a stop string ended the text.
        self.stopped = False
        self._released = 0  # characters of ``text`` given out by take_new

    def push(self, token_id: int) -> bool:
        """Add ``token_id``'s text; True when a stop string has ended the text."""
        if self._decoder is not None and not self.stopped:
            self._add(self._decoder.push(token_id))
        return self.stopped

    def finish(self) -> None:
        """The request ended: release what the decoder still holds, complete or not."""
        if self._decoder is not None and not self.stopped:
            self._add(self._decoder.flush())

    def take_new(self, *, final: bool) -> str:
        """The text not given out yet, less what may be the start of a stop string
        (all of it when ``final``)."""
        end = len(self.text)
        if not (final or self.stopped):
            end = max(self._released, end - held_back(self.text, self._stop))
        new = self.text[self._released : end]
        self._released = end
        return new

    @property
    def released_text(self) -> str:
        """The text ``take_new`` gave out so far."""
        return self.text[: self._released]

    def _add(self, piece: str) -> None:
        if not piece:
            return
        start = len(self.text)
        self.text += piece
        if self._stop:
            at = find_stop(self.text, self._stop, start)
            if at is not None:
                self.text = self.text[:at]
                self.stopped = True
