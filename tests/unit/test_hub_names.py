"""Hub names and llama-server's `-hf` file rules (runtime/hub.py), on listings."""

import pytest

from superfluid.errors import ModelLoadError
from superfluid.runtime.hub import HubName, folder_files, parse, pick_gguf

REPO = ["README.md", "Qwen3-4B-IQ2_XS.gguf", "Qwen3-4B-Q2_K.gguf", "Qwen3-4B-Q4_K_M.gguf", "Qwen3-4B-Q8_0.gguf",
        "mmproj-Qwen3-4B-Q4_K_M.gguf", "imatrix.gguf"]


@pytest.mark.parametrize("text,want", [
    ("Qwen/Qwen3-4B-GGUF", HubName("Qwen/Qwen3-4B-GGUF")),
    ("Qwen/Qwen3-4B-GGUF:Q4_K_M", HubName("Qwen/Qwen3-4B-GGUF", tag="Q4_K_M")),
    ("Qwen/Qwen3-4B-GGUF:qwen3-4b-q8_0.gguf", HubName("Qwen/Qwen3-4B-GGUF", file="qwen3-4b-q8_0.gguf")),
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0", HubName("bartowski/Llama-3.2-1B-Instruct-GGUF", tag="Q8_0")),
    ("https://huggingface.co/org/m.v1", HubName("org/m.v1")),
])
def test_names_parse_as_the_user_gave_them(text, want):
    assert parse(text) == want
    assert str(parse(text)) == text.split("co/", 1)[-1]  # the served id: the name, without a host


@pytest.mark.parametrize("text", ["model.gguf", "models/foo.gguf", "./a/b", "/abs/path", "~/m/x", "noslash", "a/b/c",
                                  "a/../b", "a/b:x/y", "", "a/b:", "-x/y"])
def test_paths_and_non_names_are_not_names(text):
    assert parse(text) is None


def test_a_tag_picks_its_file_any_case_and_never_a_projector():
    assert pick_gguf(REPO, tag="Q4_K_M") == ["Qwen3-4B-Q4_K_M.gguf"]
    assert pick_gguf(REPO, tag="q8_0") == ["Qwen3-4B-Q8_0.gguf"]
    assert pick_gguf(REPO, tag="Q5_K_M") == []


def test_no_tag_is_q4_k_m_then_q8_0_then_the_first_model_file():
    assert pick_gguf(REPO) == ["Qwen3-4B-Q4_K_M.gguf"]
    assert pick_gguf([f for f in REPO if "Q4_K_M" not in f]) == ["Qwen3-4B-Q8_0.gguf"]
    assert pick_gguf(["mmproj-x-f16.gguf", "x-F16.gguf", "x-BF16.gguf"]) == ["x-BF16.gguf"]


def test_a_split_gguf_is_picked_whole_in_order():
    files = ["big/m-Q4_K_M-00002-of-00003.gguf", "big/m-Q4_K_M-00001-of-00003.gguf",
             "big/m-Q4_K_M-00003-of-00003.gguf", "m-Q8_0.gguf"]
    assert pick_gguf(files, tag="Q4_K_M") == [f"big/m-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with pytest.raises(ModelLoadError, match="part 1 of 3"):
        pick_gguf(files[1:], tag="Q4_K_M")


def test_a_file_named_exactly():
    assert pick_gguf(REPO, file="qwen3-4b-q2_k.gguf") == ["Qwen3-4B-Q2_K.gguf"]
    assert pick_gguf(REPO, file="nope.gguf") == []


def test_a_folder_takes_weights_config_and_tokenizer_but_no_pickles():
    files = ["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "onnx/model.onnx",
             "1_Pooling/config.json", "vocab.txt", "chat_template.jinja", "README.md"]
    assert folder_files(files) == ["config.json", "model.safetensors", "tokenizer.json", "1_Pooling/config.json",
                                   "vocab.txt", "chat_template.jinja"]
