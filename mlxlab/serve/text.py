"""Text in and out of the server: tokenizers, chat templates and streaming detokenizers.

A local model directory brings its own tokenizer and chat template (mlx-lm's ``load_tokenizer``
and ``TokenizerWrapper``, whose streaming detokenizers hold back a multi-byte character until it
is whole). A preset has random weights and no tokenizer, so the server uses :class:`ByteTokenizer`:
a token is a byte (every preset's vocabulary has at least 256 ids), text is UTF-8, and an id the
model produces above 255 is written as ``<|id|>``; the chat template is a plain
``<|role|>\\ncontent\\n`` per message. Everything runs offline.
"""

from __future__ import annotations

import codecs
import copy
from pathlib import Path
from typing import List, Mapping, Optional, Sequence


class ByteDetokenizer:
    """Streaming UTF-8 decode of byte tokens: :meth:`add` returns the text that is complete so far
    (a character split across tokens waits for its last byte)."""

    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int) -> str:
        if 0 <= token < 256:
            return self._utf8.decode(bytes([token]))
        return self._utf8.decode(b"", final=True) + f"<|{token}|>"

    def finish(self) -> str:
        return self._utf8.decode(b"", final=True)


class ByteTokenizer:
    """Bytes as tokens (see the module docstring)."""

    name = "bytes"
    eos_token_ids: Sequence[int] = ()

    def encode(self, text: str) -> List[int]:
        return list(text.encode("utf-8"))

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> List[int]:
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"
        return self.encode(text)

    def detokenizer(self) -> ByteDetokenizer:
        return ByteDetokenizer()


class _WrappedDetokenizer:
    """mlx-lm's streaming detokenizer (one per stream) behind :class:`ByteDetokenizer`'s methods."""

    def __init__(self, detok):
        self._d = detok
        self._d.reset()

    def add(self, token: int) -> str:
        self._d.add_token(token)
        return self._d.last_segment

    def finish(self) -> str:
        self._d.finalize()
        return self._d.last_segment


class HFTokenizer:
    """A model directory's tokenizer through mlx-lm's ``TokenizerWrapper``."""

    def __init__(self, path: Path):
        from mlx_lm.utils import load_tokenizer  # transformers: only for a model directory

        self._tok = load_tokenizer(Path(path))
        self.name = str(path)
        self.eos_token_ids = sorted(self._tok.eos_token_ids or ())

    def encode(self, text: str) -> List[int]:
        return list(self._tok.encode(text))

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> List[int]:
        if getattr(self._tok, "chat_template", None):
            return list(self._tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True))
        return self.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ")

    def detokenizer(self) -> _WrappedDetokenizer:
        return _WrappedDetokenizer(copy.copy(self._tok.detokenizer))


def tokenizer_for(model_name_or_path: str) -> "ByteTokenizer | HFTokenizer":
    """The tokenizer a served model uses: its own for a directory holding tokenizer files, else
    the byte tokenizer."""
    path = Path(model_name_or_path)
    if path.is_dir() and any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return HFTokenizer(path)
    return ByteTokenizer()


def stop_index(text: str, stops: Sequence[str]) -> Optional[int]:
    """Where the first stop string in ``text`` begins, or None."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def safe_prefix(text: str, stops: Sequence[str]) -> int:
    """How much of ``text`` can be sent while the rest might still grow into a stop string: all of
    it but the longest tail that is a proper prefix of a stop string."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return len(text) - hold
