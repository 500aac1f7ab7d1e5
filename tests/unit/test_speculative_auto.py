"""--speculative auto: suffix drafts where Arctic Inference's suffix tree is installed, else
n-gram; refused with --deterministic as every drafter is."""

from superfluid.cli.engine_config import engine_config
from superfluid.cli.main import parser
from superfluid.runtime import suffix
from superfluid.runtime.registry import embedded_model


def test_auto_takes_suffix_where_the_tree_is_installed_else_ngram(monkeypatch, capsys):
    src = embedded_model()
    args = parser().parse_args(["serve", "--speculative", "auto"])
    monkeypatch.setattr(suffix, "suffix_tree_available", lambda: True)
    ec = engine_config(args, src)
    assert ec.speculative == "suffix" and ec.spec_tokens == 8
    monkeypatch.setattr(suffix, "suffix_tree_available", lambda: False)
    assert engine_config(args, src).speculative == "ngram"
    assert engine_config(parser().parse_args(["serve", "--speculative", "auto", "--deterministic"]), src) == 2
    assert "--deterministic needs" in capsys.readouterr().err


def test_the_check_answers_as_the_import_does():
    try:
        suffix.suffix_tree_class()
        installed = True
    except Exception:  # noqa: BLE001 -- ModelLoadError: not installed here
        installed = False
    assert suffix.suffix_tree_available() is installed
