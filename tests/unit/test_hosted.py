"""api/hosted.py: the dropped-tools header and log memory stay bounded whatever types a client sends."""

from superfluid.api import hosted


def test_notice_is_bounded():
    h = hosted.notice("/t", [f"{'x' * 500}{i}" for i in range(10_000)] + ["web_search"] * 3)
    names = h[hosted.HEADER].split(",")
    assert len(names) <= hosted.MAX_NAMES and all(len(n) <= hosted.MAX_NAME for n in names)
    for i in range(2000):
        hosted.notice("/t", [f"type{i}"])
    assert len(hosted._said) <= hosted.MAX_SAID + hosted.MAX_NAMES
    assert hosted.notice("/t", []) == {}
