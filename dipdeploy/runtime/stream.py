"""Incremental detokenisation for streaming: complete characters only, stop strings cut and never shown.

A byte-level BPE (SmolLM2, Llama 3, Qwen2) splits one multi-byte UTF-8 character (emoji, CJK) over
several tokens, and decoding a token alone yields U+FFFD for each fragment. ``TextStream`` decodes a
window of recent tokens (from the last point where the text was whole) and releases text only once it no
longer ends in an incomplete character, so every printed piece is final. It also
holds back a tail that could be the start of a stop string, so a stop string is never printed, and
cuts the answer where one appears. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REPLACEMENT = "\ufffd"


@dataclass
class TextStream:
    """Feed token ids one by one (``push``), print what it returns; ``finish`` returns the rest.

    ``text`` is the answer so far as printed plus what is held back; after a stop string it is the text
    before it and ``stopped`` is that string."""

    tokenizer: object
    stop: tuple[str, ...] = ()
    text: str = ""
    stopped: str | None = None
    _ids: list[int] = field(default_factory=list)
    _prefix: int = 0  # _ids[_prefix:_read]: the last window already decoded into ``text``
    _read: int = 0
    _shown: int = 0  # characters of ``text`` already returned

    def push(self, token: int) -> str:
        """Add one token; the newly printable text ('' while a character or a possible stop string is
        incomplete, and after a stop string)."""
        if self.stopped is not None:
            return ""
        self._ids.append(int(token))
        before = self.tokenizer.decode(self._ids[self._prefix:self._read])
        after = self.tokenizer.decode(self._ids[self._prefix:])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""  # an incomplete character: wait for its next bytes
        self.text += after[len(before):]
        self._prefix, self._read = self._read, len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """The held-back text at the end of the answer (an incomplete character left shows as U+FFFD)."""
        if self.stopped is None and self._read < len(self._ids):
            before = self.tokenizer.decode(self._ids[self._prefix:self._read])
            self.text += self.tokenizer.decode(self._ids[self._prefix:])[len(before):]
            self._read = len(self._ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, self._shown)) >= 0]
        if hits:
            i, s = min(hits)
            self.text, self.stopped = self.text[:i], s
            final = True
        end = len(self.text) if final else len(self.text) - self._held()
        out = self.text[self._shown:end]
        self._shown = max(self._shown, end)
        return out

    def _held(self) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text) - self._shown), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
