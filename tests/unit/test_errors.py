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
    (E.ContextLengthExceeded, 400, "exceed_context_size_error", "context_length_exceeded"),
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


def test_context_length_exceeded_speaks_both_clients_dialects():
    """OpenAI's code and phrase, llama-server's type, phrase and counts (clients of either
    detect an overflow and trim their history from these)."""
    err = E.ContextLengthExceeded.over(9412, 8192).body()["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "exceed_context_size_error"
    assert (err["n_prompt_tokens"], err["n_ctx"], err["param"]) == (9412, 8192, "messages")
    assert "request (9412 tokens) exceeds the available context size (8192 tokens)" in err["message"]
    assert "maximum context length is 8192 tokens" in err["message"]
    err = E.ContextLengthExceeded.over(500, 512, 100).body()["error"]
    assert err["n_prompt_tokens"] == 500 and "request (600 tokens)" in err["message"]
    assert "500 in the prompt, 100 for the completion" in err["message"]


# -- across Link W (errors.ErrorReport, in plan.LaneError) ---------------------------------

def _across(e: BaseException) -> E.SuperfluidError:
    """What the client gets for `e` raised for one lane in the worker: the report as the real
    StepResult codec and msgpack carry it over Link W, then taken back in the daemon."""
    import msgpack

    from superfluid.plan import LaneError, StepResult
    wire = msgpack.unpackb(msgpack.packb(StepResult(1, (), errors=(LaneError(3, E.ErrorReport.of(e)),)).to_wire()))
    (lane,) = StepResult.from_wire(wire).errors
    assert lane.seq == 3
    return lane.error.exception()


@pytest.mark.parametrize("err", [
    E.BadRequest("the grammar cannot be enforced", param="response_format"),
    E.ContextLengthExceeded("input 0 has 900 tokens", param="input"),
    E.EmbeddingUnsupported("this model embeds an input in one piece", param="model"),
    E.PayloadTooLarge("too large"),
    E.BadRequest("x", code="invalid_json"),
])
def test_the_requests_own_error_keeps_its_class_status_code_and_param_across_the_link(err):
    got = _across(err)
    assert type(got) is type(err) and got.status == err.status < 500
    assert got.body() == err.body()


def test_a_subclass_crosses_as_its_nearest_linked_class_with_its_code():
    class TooDeep(E.BadRequest):  # a class of the runtime's own: its name is never looked up
        code = "too_deep"
    got = _across(TooDeep("nested too deep", param="grammar"))
    assert type(got) is E.BadRequest and got.status == 400
    assert got.body()["error"] == {"message": "nested too deep", "type": "invalid_request_error",
                                   "param": "grammar", "code": "too_deep"}


@pytest.mark.parametrize(("err", "code"), [
    (RecursionError("maximum recursion depth exceeded"), "generation_failed"),
    (ValueError("lane 3 has no sampled token to feed"), "generation_failed"),  # a bug, not the request
    (E.WorkerCrashed("the stage went away", code="stage_unavailable"), "stage_unavailable"),
    (E.SessionBusy("busy"), "session_busy"),  # a 4xx the worker never raises: not linked, so a 5xx
])
def test_a_worker_fault_stays_a_server_error(err, code):
    got = _across(err)
    assert type(got) is E.SuperfluidError and got.status == 500 and got.type == "server_error"
    assert got.code == code and str(err) in got.message


@pytest.mark.parametrize("kind", ["WorkerCrashed", "SuperfluidError", "Exception", "os.system", "", 7, None,
                                  ["BadRequest"], "badrequest"])
def test_a_name_from_the_wire_picks_only_a_linked_class(kind):
    got = E.ErrorReport.from_wire([kind, "m", "c", "p"]).exception()
    assert type(got) is E.SuperfluidError and got.status == 500 and got.code == "c"


def test_what_crosses_is_bounded():
    got = _across(E.BadRequest("x" * 100_000, param="p" * 1000, code="c" * 1000))
    assert type(got) is E.BadRequest
    assert len(got.message) == E.MESSAGE_MAX and got.message.endswith("\u2026")
    assert len(got.param) == len(got.code) == E.NAME_MAX
    huge = E.ErrorReport.from_wire(["BadRequest", "y" * 100_000, None, None])  # a peer that did not bound it
    assert len(huge.message) == E.MESSAGE_MAX and huge.exception().status == 400
    assert len(_across(ValueError("z" * 100_000)).message) == E.MESSAGE_MAX


def test_only_client_errors_are_linked():
    assert E.LINKED and all(400 <= c.status < 500 and E.LINKED[c.__name__] is c for c in E.LINKED.values())
