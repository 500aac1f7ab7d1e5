"""The daemon's tokenizer for a Hugging Face folder (config.json + safetensors + tokenizer.json),
with the same face as codec/tokenizer.py's GGUF one: every token's bytes once (detokenizing is
a list lookup), the chat template, end-of-generation ids and the model's shape.

Token bytes come from the tokenizer's own alphabet: byte-level BPE (GPT-2, Llama 3, SmolLM)
maps bytes to printable characters; SentencePiece-style vocabularies write a space as '▁' and
unknown bytes as <0xNN>. Special tokens render as nothing in text (as llama.cpp does) and by
name in `token_text`. Text from users is encoded with special tokens as plain text unless a
caller asks to parse them (the rendered prompt does)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from ..errors import ModelLoadError
from .tokenizer import ModelShape, Vocab


def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def eos_ids(folder: str | Path) -> set[int]:
    """End-of-generation ids a Hugging Face folder declares (generation_config, config)."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        eos = _json(Path(folder) / name).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids


class HfTokenizer(Vocab):
    def __init__(self, folder: str):
        from tokenizers import Tokenizer as _Tok

        d = Path(folder)
        self._lock = threading.Lock()
        try:
            self._tok = _Tok.from_file(str(d / "tokenizer.json"))
        except Exception as e:  # tokenizers raises its own exception types
            raise ModelLoadError(f"{folder} has no readable tokenizer.json ({e})") from None
        # a tokenizer.json may fix padding and truncation (MiniLM's pads and cuts at 128): the
        # daemon sees every token and checks windows itself, so an input is never cut silently
        self._tok.no_padding()
        self._tok.no_truncation()
        cfg, tcfg = _json(d / "config.json"), _json(d / "tokenizer_config.json")
        self.n_vocab = max(int(cfg.get("vocab_size") or 0), self._tok.get_vocab_size(with_added_tokens=True))
        specials = {int(k): v["content"] for k, v in (tcfg.get("added_tokens_decoder") or {}).items()
                    if v.get("special")}
        for i, added in self._tok.get_added_tokens_decoder().items():
            if added.special:
                specials[int(i)] = added.content
        self._specials = specials
        # the tokens llguidance's tokenizer.json reader holds as special: special added tokens,
        # and other added tokens shaped like <...> (see Vocab.special_id)
        self._grammar_specials = {a.content: int(i) for i, a in self._tok.get_added_tokens_decoder().items()
                                  if a.special or (a.content.startswith("<") and a.content.endswith(">"))}
        self._grammar_specials.update({s: t for t, s in specials.items()})
        spec = _json(d / "tokenizer.json")
        self._byte_level = "ByteLevel" in json.dumps([spec.get("decoder"), spec.get("pre_tokenizer")])
        self.pieces: list[bytes] = [self._piece(t) for t in range(self.n_vocab)]
        self.special_pieces: dict[int, bytes] = {t: s.encode() for t, s in specials.items()}

        def token_id(v) -> int:
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                i = self._tok.token_to_id(v)
                return -1 if i is None else int(i)
            return int(v) if isinstance(v, int) else -1

        self.bos = token_id(tcfg.get("bos_token", cfg.get("bos_token_id")))
        self.eos = token_id(tcfg.get("eos_token", cfg.get("eos_token_id")))
        self.add_bos = bool(tcfg.get("add_bos_token", False))
        self.eog = frozenset(eos_ids(d) | ({self.eos} if self.eos >= 0 else set()))
        template = tcfg.get("chat_template")
        if not template and (d / "chat_template.jinja").exists():
            template = (d / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template or None
        heads = int(cfg.get("num_attention_heads") or 1)
        self.shape = ModelShape(n_ctx_train=int(cfg.get("max_position_embeddings") or 0),
                                n_layer=int(cfg.get("num_hidden_layers") or 0), n_head=heads,
                                n_head_kv=int(cfg.get("num_key_value_heads") or heads),
                                n_embd=int(cfg.get("hidden_size") or 0))

    def _piece(self, token: int) -> bytes:
        if token in self._specials:
            return b""
        s = self._tok.id_to_token(token)
        if s is None:
            return b""
        if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            try:
                return bytes([int(s[3:5], 16)])
            except ValueError:
                pass
        if self._byte_level and _BYTES.keys() >= set(s):
            return bytes(_BYTES[c] for c in s)
        return s.replace("▁", " ").encode("utf-8")

    def meta(self, key: str) -> str | None:
        return None

    def token_text(self, token: int) -> bytes:
        """Bytes of a token as shown to a user: special tokens by name."""
        return self.pieces[token] or self.special_pieces.get(token, b"")

    def special_id(self, text: str) -> int | None:
        return self._grammar_specials.get(text)

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Token ids of `text`; add_special adds the post-processor's specials (BERT: [CLS] ... [SEP])."""
        with self._lock:  # the flag is the tokenizer's state: embeddings tokenize in threads
            self._tok.encode_special_tokens = not parse_special
            return list(self._tok.encode(text, add_special_tokens=add_special).ids)

    def encode_pair(self, a: str, b: str) -> tuple[list[int], int]:
        """A (query, document) pair for a cross-encoder, with the post-processor's specials for
        a pair (BERT: [CLS] a [SEP] b [SEP]), and the index where segment B starts: its first
        token of type 1, or, for a tokenizer that gives pairs no type ids (RoBERTa), the first
        token of b. Special tokens in either text are plain text."""
        return self.encode_pairs(a, [b])[0]

    def encode_pairs(self, a: str, bs: list[str]) -> list[tuple[list[int], int]]:
        """encode_pair(a, b) for every b, with `a` tokenized once (a rerank's query is the same
        for up to 2,048 documents): each pair is the post-processor's join of the two."""
        with self._lock:
            self._tok.encode_special_tokens = True
            first = self._tok.encode(a, add_special_tokens=False)
            encs = [self._tok.post_process(first, self._tok.encode(b, add_special_tokens=False))
                    for b in bs]
        return [self._pair(enc) for enc in encs]

    @staticmethod
    def _pair(enc) -> tuple[list[int], int]:
        ids = list(enc.ids)
        at = next((i for i, t in enumerate(enc.type_ids) if t == 1), None)
        if at is None:
            at = next((i for i, s in enumerate(enc.sequence_ids) if s == 1), len(ids))
        return ids, at


_BYTES = _byte_decoder()
