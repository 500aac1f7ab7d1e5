"""The daemon's tokenizer: a vocab-only llama.cpp handle on the model file (no weights, no
KV), plus the GGUF metadata the daemon needs (chat template, special tokens, sizes)."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import llama_cpp as ll

from ..errors import ModelLoadError


@ll.llama_log_callback
def _quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # warnings and errors only, unless debugging (ggml_log_level: 3 WARN, 4 ERROR; this kept only
    # 3, thinking it ERROR, so an error such as "invalid logits id" was never seen)
    if level in (3, 4) or os.environ.get("SUPERFLUID_DEBUG"):
        os.write(2, text or b"")


def quiet_llama_logs() -> None:
    """llama.cpp prints pages of load logs to stderr; keep only its errors."""
    ll.llama_log_set(_quiet, ctypes.c_void_p(0))


@dataclass(frozen=True)
class ModelShape:
    n_ctx_train: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_embd: int

    @property
    def kv_bytes_per_token(self) -> int:
        head_dim = self.n_embd // max(1, self.n_head)
        return 2 * self.n_layer * self.n_head_kv * head_dim * 2  # K and V, f16


class Vocab:
    """What every tokenizer the daemon uses shares: every token's bytes (`pieces`, so
    detokenizing is a list lookup) and the prompt conventions. Subclasses set n_vocab, bos,
    add_bos, pieces and implement `encode`."""
    n_vocab: int
    bos: int
    add_bos: bool
    pieces: list[bytes]

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        raise NotImplementedError

    def encode_prompt(self, text: str) -> list[int]:
        """A whole prompt: special tokens parsed, BOS added when the model wants one."""
        toks = self.encode(text, parse_special=True)
        if self.add_bos and self.bos >= 0 and (not toks or toks[0] != self.bos):
            toks.insert(0, self.bos)
        return toks

    def decode(self, tokens: list[int]) -> str:
        return b"".join(self.pieces[t] for t in tokens if 0 <= t < self.n_vocab).decode(
            "utf-8", errors="replace")

    def valid(self, token: int) -> bool:
        return 0 <= token < self.n_vocab

    def special_id(self, text: str) -> int | None:
        """The id of the one token `text` is, when the grammar engine holds that token as
        special (llguidance never matches a special token against quoted text, so a grammar
        must name it by id: grammar.Literals); None for text that is several tokens or an
        ordinary one. The rule is llguidance's own: a control token, or an added token shaped
        like <...> (Qwen's <tool_call>, DeepSeek's <｜tool▁calls▁begin｜>)."""
        return None


class Tokenizer(Vocab):
    def __init__(self, path: str):
        quiet_llama_logs()
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.vocab_only = True
        self._model = ll.llama_model_load_from_file(path.encode(), mp)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not read the vocabulary of {path}")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab = ll.llama_vocab_n_tokens(self._vocab)
        self.bos = ll.llama_vocab_bos(self._vocab)
        self.eos = ll.llama_vocab_eos(self._vocab)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self._vocab))
        self.eog = frozenset(t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self._vocab, t))
        # every token's bytes, once: detokenizing is then a list lookup
        self.pieces: list[bytes] = [self._piece(t, special=False) for t in range(self.n_vocab)]
        self.special_pieces: dict[int, bytes] = {}
        self._special_ids: dict[str, int | None] = {}
        self.chat_template = self.meta("tokenizer.chat_template")
        arch = self.meta("general.architecture") or "llama"
        m = self.meta
        self.shape = ModelShape(
            n_ctx_train=int(m(f"{arch}.context_length") or 0),
            n_layer=int(m(f"{arch}.block_count") or 0),
            n_head=int(m(f"{arch}.attention.head_count") or 1),
            n_head_kv=int(m(f"{arch}.attention.head_count_kv") or m(f"{arch}.attention.head_count") or 1),
            n_embd=int(m(f"{arch}.embedding_length") or 0))

    def meta(self, key: str) -> str | None:
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = ll.llama_model_meta_val_str(self._model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    def _piece(self, token: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def token_text(self, token: int) -> bytes:
        """Bytes of a token as shown to a user: special tokens by name."""
        if token not in self.special_pieces:
            self.special_pieces[token] = self._piece(token, special=True)
        return self.pieces[token] or self.special_pieces[token]

    def special_id(self, text: str) -> int | None:
        # llguidance.llamacpp.lltokenizer_from_vocab's rule, on the same vocab
        if text not in self._special_ids:
            ids = self.encode(text, parse_special=True)
            t = ids[0] if len(ids) == 1 else -1
            name = self.token_text(t) if t >= 0 else b""
            attr = ll.llama_vocab_get_attr(self._vocab, t) if t >= 0 else 0
            special = name == text.encode() and bool(
                attr & ll.LLAMA_TOKEN_ATTR_CONTROL
                or (attr & ll.LLAMA_TOKEN_ATTR_USER_DEFINED and name.startswith(b"<") and name.endswith(b">")))
            self._special_ids[text] = t if special else None
        return self._special_ids[text]

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])

