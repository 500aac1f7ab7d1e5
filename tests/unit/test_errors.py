"""The exception tree: statuses, types, codes and the OpenAI-style body."""

import pytest

from superfluid import errors as E


def test_body_shape():
    e = E.BadRequest("bad max_tokens", param="max_tokens")
    assert e.body() == {"error": {"message": "bad max_tokens", "type": "invalid_request_error",
                                  "param": "max_tokens", "code": None}}


def test_base_error_defaults():
    e = E.SuperfluidError("boom")
    assert (e.status, e.type, e.code, e.param) == (500, "server_error", None, None)
    assert str(e) == "boom" and e.message == "boom"


@pytest.mark.parametrize(("cls", "status", "etype", "code"), [
    (E.BadRequest, 400, "invalid_request_error", None),
    (E.ContextLengthExceeded, 400, "invalid_request_error", "context_length_exceeded"),
    (E.ModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (E.PayloadTooLarge, 413, "invalid_request_error", "request_too_large"),
    (E.WorkerCrashed, 500, "server_error", "worker_crashed"),
    (E.WorkerUnavailable, 503, "server_error", "worker_unavailable"),
    (E.ProtocolError, 500, "server_error", "protocol_error"),
    (E.ModelLoadError, 400, "invalid_request_error", "model_load_error"),
])
def test_statuses_types_and_codes(cls, status, etype, code):
    e = cls("msg")
    assert issubclass(cls, E.SuperfluidError)
    assert (e.status, e.type, e.code) == (status, etype, code)
    assert e.body()["error"] == {"message": "msg", "type": etype, "param": None, "code": code}


def test_code_can_be_overridden_per_instance():
    e = E.BadRequest("x", code="invalid_json")
    assert e.body()["error"]["code"] == "invalid_json"
    assert E.BadRequest("y").code is None  # the class default is untouched


def test_context_length_exceeded_is_a_bad_request():
    assert issubclass(E.ContextLengthExceeded, E.BadRequest)
