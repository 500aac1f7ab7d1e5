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


def test_the_header_is_printable_ascii_whatever_the_types():
    """A type outside Latin-1 made the header fail to encode after the job was submitted
    (issue 54); control characters would split a log line."""
    h = hosted.notice("/t", ["web_search_\u2603", "x\r\nset-cookie: a=b", " lead, comma", "caf\u00e9" * 40])
    value = h[hosted.HEADER]
    assert value.isascii() and value.isprintable() and " " not in value
    value.encode("latin-1")
    names = value.split(",")
    assert "web_search_\\u2603" in names and "x\\r\\nset-cookie:_a=b" in names and "_lead__comma" in names
    assert all(len(n) <= hosted.MAX_NAME for n in names)
