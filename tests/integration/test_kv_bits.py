"""--kv-bits (issue 34): llama.cpp's KV cache in q8_0 or q4_0 cells, on the embedded model:
a lane's KV state shrinks to the cells' size, a disk-tier file of one width never loads at
another, the window sizing counts the smaller cells, and a daemon serves with it."""

import openai
import pytest

from superfluid.codec.template import ChatTemplate
from superfluid.codec.tokenizer import Tokenizer
from superfluid.plan import LaneOpen, Run, StepPlan
from superfluid.request import SamplingParams
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.memory_fit import fit_context, kv_bytes_per_token
from superfluid.runtime.registry import embedded_model

from .daemon import Daemon


@pytest.fixture(scope="module")
def prompt():
    tok = Tokenizer(embedded_model().path)
    text = ChatTemplate(tok.chat_template).render([{"role": "user", "content": "List three rivers. " * 20}])
    return tok.encode_prompt(text)


def state_bytes(bits: int, prompt: list[int]) -> tuple[int, str]:
    """The KV state of one lane after prefilling `prompt` at `bits`, and the runtime's disk-tier format."""
    rt = LlamaCppRuntime(embedded_model().path, lanes=1, n_ctx=512, threads=1, batch_tokens=512, kv_bits=bits)
    try:
        rt.step(StepPlan(1, opens=(LaneOpen(0, SamplingParams(temperature=0)),),
                         runs=(Run(0, 0, tuple(prompt), True),)))
        state = rt.save_state(0, len(prompt))
        assert state is not None
        return len(state), rt.kv_format
    finally:
        rt.close()


def test_quantized_cells_shrink_the_kv_state_and_change_the_disk_format(prompt):
    f16, fmt16 = state_bytes(16, prompt)
    q8, fmt8 = state_bytes(8, prompt)
    q4, fmt4 = state_bytes(4, prompt)
    # q8_0 is 34 bytes per 32 values (53% of f16), q4_0 18 (28%); the state has a small header besides
    assert 0.50 < q8 / f16 <= 0.55 and 0.26 < q4 / f16 <= 0.30, (f16, q8, q4)
    assert len({fmt16, fmt8, fmt4}) == 3 and fmt8.endswith("-kv8")


def test_the_window_sizing_counts_the_smaller_cells():
    f16 = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64
    assert kv_bytes_per_token(f16, 16) == f16 and kv_bytes_per_token(f16, 8) == f16 * 17 // 32
    fit = dict(requested=None, n_ctx_train=1 << 20, lanes=8, model_bytes=0, mem_bytes=1 << 30)
    assert fit_context(kv_bytes_per_token=kv_bytes_per_token(f16, 8), **fit) >= \
        1.8 * fit_context(kv_bytes_per_token=f16, **fit)


def test_a_daemon_serves_with_an_8_bit_cache():
    d = Daemon("--kv-bits", "8", max_context=512, max_batch=2)
    try:
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="x")
        out = client.chat.completions.create(model="x", max_tokens=12, temperature=0,
                                             messages=[{"role": "user", "content": "Name a river."}])
        assert out.choices[0].message.content and out.usage.completion_tokens > 0
    finally:
        d.stop()


def test_a_runtime_without_quantized_cells_is_refused_in_one_line():
    import subprocess
    import sys

    from superfluid.runtime.registry import embedded_embedding_model
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", embedded_embedding_model().path,
                        "--kv-bits", "8"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        "superfluid: --kv-bits 8 quantizes llama.cpp's KV cache; the sentence runtime keeps its own at 16 bits")
