"""RoPE scaling's pure parts (runtime/rope.py): the stretch derived from the window, the
line the daemon says about it, the flags, and what each runtime is handed."""

import math

import pytest

from superfluid.cli.engine_config import engine_config as _engine_config
from superfluid.cli.main import parser
from superfluid.cli.llama_flags import apply_flags
from superfluid.runtime.registry import ModelSource
from superfluid.runtime.rope import Rope, check, derive, describe, hf_rope, trained_window
from superfluid.link.conn import Connection
from superfluid.worker.protocol import LINK_W, VERSION, Hello, WorkerSettings


def rope(kind="", scale=0.0, orig=0, n_ctx=32768, trained=8192) -> Rope:
    return derive(kind, scale, orig, n_ctx=n_ctx, n_ctx_train=trained)


def test_yarn_without_a_scale_stretches_the_trained_window_to_the_lane():
    r = rope("yarn")
    assert (r.kind, r.factor, r.base, r.freq_scale, r.scales) == ("yarn", 4.0, 8192, 0.25, True)
    assert rope("linear", n_ctx=12288).factor == 1.5


def test_an_explicit_scale_is_kept_and_yarn_orig_ctx_is_the_base():
    assert rope("yarn", scale=2.0).factor == 2.0
    r = rope("yarn", orig=4096)
    assert (r.factor, r.base, r.orig_ctx) == (8.0, 4096, 4096)


def test_within_the_trained_window_nothing_is_stretched():
    for r in (rope("yarn", n_ctx=8192), rope("linear", n_ctx=4096), rope(n_ctx=32768)):
        assert r.factor == 0.0 and r.freq_scale == 0.0 and not r.scales  # llama.cpp: the model's own
    assert not rope("yarn", trained=0).scales  # an unknown trained window: nothing to derive from


def test_none_never_stretches():
    r = rope("none")
    assert (r.kind, r.factor, r.scales) == ("none", 0.0, False)


def test_an_explicit_scale_sizes_the_default_window():
    assert trained_window(8192, 0.0) == 8192
    assert trained_window(8192, 4.0) == 32768
    assert trained_window(8192, 2.0, orig_ctx=4096) == 8192
    assert trained_window(8192, 0.5) == 8192  # a shrink never shrinks the window


def test_the_line_says_the_window_and_the_stretch():
    assert describe(rope("yarn"), 32768) == ("window 32768 tokens (yarn x4 over the trained 8192)", False)
    assert describe(rope(scale=4.0), 32768) == ("window 32768 tokens (rope scale x4 over the trained 8192)", False)
    assert describe(rope(n_ctx=4096), 4096) is None  # nothing asked, nothing past: no line, as before


def test_past_the_trained_window_unstretched_is_a_warning():
    line, warn = describe(rope(), 32768)
    assert warn and "past the model's trained 8192 without rope scaling" in line and "--rope-scaling yarn" in line
    line, warn = describe(rope("none"), 32768)
    assert warn and "with --rope-scaling none" in line
    line, warn = describe(rope("yarn", scale=2.0), 32768)
    assert warn and "positions past 16384 are untrained" in line
    line, warn = describe(rope("yarn", scale=0.5), 32768)
    assert warn and "shrinks" in line
    line, warn = describe(rope("yarn", n_ctx=4096), 4096)
    assert not warn and "stretches nothing" in line


def test_contradictions_are_one_line():
    assert check("", 0.0, 0) is None and check("yarn", 4.0, 4096) is None and check("", 4.0, 0) is None
    assert "drop one" in (check("none", 2.0, 0) or "")
    assert "--rope-scaling yarn" in (check("linear", 0.0, 4096) or "")
    assert check("ntk", 0.0, 0) is not None


def test_transformers_rope_parameters():
    llama = {"rope_theta": 100000.0, "rope_type": "default"}
    assert hf_rope(rope(), llama) == llama
    assert hf_rope(rope("yarn"), llama) == {"rope_theta": 100000.0, "rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 8192}
    assert hf_rope(rope("linear"), llama) == {"rope_theta": 100000.0, "rope_type": "linear", "factor": 4.0}
    assert hf_rope(rope(scale=2.0), llama)["rope_type"] == "linear"  # llama.cpp's default type, too
    assert hf_rope(rope("none"), {**llama, "rope_type": "yarn", "factor": 2.0})["rope_type"] == "default"


def test_llamacpp_context_params():
    ll = pytest.importorskip("llama_cpp")
    from superfluid.runtime.llamacpp_params import context_params
    plain = context_params(2, 32768, 1, 256)
    asked = context_params(2, 32768, 1, 256, rope("yarn"))
    assert (plain.rope_scaling_type, plain.rope_freq_scale, plain.yarn_orig_ctx) == (
        ll.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED, 0.0, 0)
    assert (asked.rope_scaling_type, asked.rope_freq_scale, asked.yarn_orig_ctx) == (
        ll.LLAMA_ROPE_SCALING_TYPE_YARN, 0.25, 0)
    same = context_params(2, 4096, 1, 256, rope())  # no flag: llama.cpp's defaults, the model's own rope
    assert (same.rope_scaling_type, same.rope_freq_scale, same.yarn_orig_ctx) == (
        ll.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED, 0.0, 0)


def serve(*argv: str):
    a = parser().parse_args(["serve", *argv])
    return a, apply_flags(a)


def test_flags_reach_the_engine_config_and_the_worker():
    a, problem = serve("--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "8192")
    assert problem is None
    ec = _engine_config(a, ModelSource("/m.gguf", "m"))
    assert not isinstance(ec, int)
    assert (ec.rope_scaling, ec.rope_scale, ec.yarn_orig_ctx) == ("yarn", 4.0, 8192)
    ws = WorkerSettings("/m.gguf", 2, 32768, 1, 256, rope_scaling="yarn", rope_scale=4.0, yarn_orig_ctx=8192)
    a_end, b_end = Connection(LINK_W), Connection(LINK_W)
    b_end.receive_data(a_end.send(Hello((VERSION,), ws)))
    assert b_end.next_event()[1].settings == ws


def test_llama_servers_freq_scale_and_bad_values():
    a, problem = serve("--rope-freq-scale", "0.25")
    assert problem is None and a.rope_scale == 4.0
    assert serve("--rope-freq-scale", "0.25", "--rope-scale", "2")[1] is not None
    assert serve()[0].rope_scaling == "" and serve()[0].rope_scale == 0.0
    for bad in (["--rope-scaling", "ntk"], ["--rope-scale", "0"], ["--rope-scale", "x"], ["--yarn-orig-ctx", "-1"],
                ["--rope-freq-scale", "2"]):
        with pytest.raises(SystemExit):
            parser().parse_args(["serve", *bad])


def test_contradicting_flags_exit_with_one_line(capsys):
    a, _ = serve("--rope-scaling", "none", "--rope-scale", "2")
    assert _engine_config(a, ModelSource("/m.gguf", "m")) == 2
    assert "drop one" in capsys.readouterr().err


def test_transformers_stage_stretches_its_rotary_embedding(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from superfluid.runtime.stage import StageModel
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    plain = StageModel(str(tmp_path), 0, 1)
    yarn = StageModel(str(tmp_path), 0, 1, rope=rope("yarn"))
    linear = StageModel(str(tmp_path), 0, 1, rope=rope("linear"))
    assert plain.rotary.attention_scaling == 1.0
    assert yarn.rotary.attention_scaling == pytest.approx(1 + 0.1 * math.log(4))  # YaRN's mscale
    base = plain.rotary.inv_freq
    assert torch.allclose(linear.rotary.inv_freq, base / 4)
    # YaRN keeps the fast-turning dimensions and stretches the slow ones
    assert torch.isclose(yarn.rotary.inv_freq[0], base[0]) and torch.isclose(yarn.rotary.inv_freq[-1], base[-1] / 4)


def test_the_kv_disk_tier_never_mixes_stretches():
    pytest.importorskip("llama_cpp")
    from superfluid.runtime.rope import rope_key
    assert rope_key(rope(n_ctx=4096)) == ""  # the model's own: the key entries had before rope scaling
    keys = {rope_key(r) for r in (rope("yarn"), rope("linear"), rope("yarn", scale=2.0), rope("yarn", orig=4096),
                                  rope("none"), rope(scale=4.0))}
    assert len(keys) == 6 and "" not in keys
