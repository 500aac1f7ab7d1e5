"""A vocab-only llama.cpp handle on a GGUF (no weights, no KV): the end-of-generation ids and
the llguidance tokenizer for runtimes whose weights live elsewhere (transformers on a
converted GGUF, a pipeline of stage nodes)."""

from __future__ import annotations

import numpy as np

from ..errors import ModelLoadError


class GgufVocab:
    def __init__(self, path: str):
        import llama_cpp as ll

        from ..codec.tokenizer import quiet_llama_logs

        quiet_llama_logs()
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.vocab_only = True
        self._model = ll.llama_model_load_from_file(path.encode(), mp)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not read the vocabulary of {path}")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab = ll.llama_vocab_n_tokens(self._vocab)
        self.eog = np.array([t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self._vocab, t)],
                            dtype=np.int64)

    def grammar_tokenizer(self):
        from llguidance.llamacpp import lltokenizer_from_vocab

        return lltokenizer_from_vocab(self._vocab)

    def close(self) -> None:
        if self._model is not None:
            import llama_cpp as ll

            ll.llama_model_free(self._model)
            self._model = None
