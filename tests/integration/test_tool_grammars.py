"""Grammars that keep the embedded model on the rails (issue 17, item 1), through the real
daemon and the openai client: tool_choice "required" always gives a parsed call, also
sampled at temperature 1 on a tight budget; tool_choice "auto" is lazy (text, or calls once
the model writes the call-opening marker), streamed and whole, and calls on a fresh question;
parallel_tool_calls false gives exactly one call, and the default (OpenAI's: true) allows several."""

import json

from .conftest import MODEL, each

LOOKUP = {"type": "function", "function": {
    "name": "lookup_code", "description": "Look up the access code of an account.",
    "parameters": {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"],
                   "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the access code for acct-4821?"}]


def looked_up(account: str, n: int) -> list[dict]:
    """An earlier turn of an agent loop: the user asked, the assistant called the tool."""
    return [{"role": "user", "content": f"What is the access code for {account}?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {
                "name": "lookup_code", "arguments": json.dumps({"account": account})}}]}]


# after two such turns the model writes the next call itself (as text: the template has no tools)
HISTORY = looked_up("acct-1111", 1) + looked_up("acct-2222", 2) + ASK


def check_calls(c, seed) -> int:
    """The calls of one auto reply are all well-formed; markup never reaches the content."""
    assert "<tool_call>" not in (c.message.content or "") and "</tool_call>" not in (c.message.content or ""), seed
    for call in c.message.tool_calls or []:
        assert call.function.name == "lookup_code", seed
        args = json.loads(call.function.arguments)
        assert set(args) == {"account"} and isinstance(args["account"], str), (seed, args)
    if c.message.tool_calls:
        assert c.finish_reason in ("tool_calls", "length"), (seed, c)
    return len(c.message.tool_calls or [])


def test_required_at_temperature_1_on_60_tokens_gives_parsed_calls_and_never_text(client):
    # measured before: 5 of 10 seeds gave a call; one ended "stop" with no call at all, others
    # "closed" the call inside an argument string
    called = 0
    replies = each(lambda seed: client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[LOOKUP], tool_choice="required", temperature=1.0, seed=seed,
        max_tokens=60), range(10))
    for seed, r in enumerate(replies):
        c = r.choices[0]
        # "length": the budget ran out inside an argument string the model did not end; the
        # call is dropped, never shown as text
        assert c.finish_reason in ("tool_calls", "length"), (seed, c)
        assert not c.message.content, (seed, c)
        assert c.finish_reason == "length" or c.message.tool_calls, (seed, c)
        called += bool(c.message.tool_calls)
        for call in c.message.tool_calls or []:
            assert call.function.name == "lookup_code"
            args = json.loads(call.function.arguments)
            assert set(args) == {"account"} and isinstance(args["account"], str)
            assert "</tool_call>" not in args["account"] and "\n" not in args["account"]
    assert called >= 7, called  # measured: 8 of 10 (the other two never end the account string)


# a question for two accounts after a turn that answered one such with two calls: the model
# writes two calls when it may (on a fresh question it follows the default examples, one call
# a turn)
CALL = lambda n, account: {"id": f"call_{n}", "type": "function", "function": {  # noqa: E731
    "name": "lookup_code", "arguments": json.dumps({"account": account})}}
TWO = [{"role": "user", "content": "What are the access codes for acct-1111 and acct-2222?"},
       {"role": "assistant", "content": "", "tool_calls": [CALL(1, "acct-1111"), CALL(2, "acct-2222")]},
       {"role": "user", "content": "What are the access codes for acct-4821 and acct-7356?"}]


def test_parallel_tool_calls_false_gives_exactly_one_call(client):
    several, several_by_default = 0, 0

    def ask(case: tuple[int, bool | None]):
        seed, parallel = case
        kw = dict(model=MODEL, messages=TWO, tools=[LOOKUP], tool_choice="required", temperature=1.0, seed=seed,
                  max_tokens=80)
        return client.chat.completions.create(**kw, **({} if parallel is None else
                                                        {"parallel_tool_calls": parallel})).choices[0]
    cases = [(seed, parallel) for seed in range(4) for parallel in (False, None, True)]
    got = dict(zip(cases, each(ask, cases), strict=True))
    for seed in range(4):
        one = got[seed, False]
        assert len(one.message.tool_calls or []) <= 1 and not one.message.content, (seed, one)
        # the call ends the reply: "tool_calls", unless the model never ended its argument string
        assert one.finish_reason == ("tool_calls" if one.message.tool_calls else "length"), (seed, one)
        several += check_calls(got[seed, True], seed) > 1
        # the default is OpenAI's: parallel calls allowed (not the same tokens as asking for them
        # bit for bit: twelve requests batched at once are equal only up to floating point)
        several_by_default += check_calls(got[seed, None], seed) > 1
    assert several  # the same seeds with parallel calls asked for: the model does make more than one
    assert several_by_default


def test_auto_answers_in_prose_when_the_model_writes_no_call(client):
    greeting = [{"role": "user", "content": "Hi, how are you?"}]
    r = client.chat.completions.create(model=MODEL, messages=greeting, tools=[LOOKUP], temperature=0, max_tokens=16)
    c = r.choices[0]
    assert c.message.content and not c.message.tool_calls
    assert c.finish_reason in ("stop", "length")


def test_auto_calls_on_a_fresh_question_after_the_default_examples(client):
    # the template has no tools: the note's example exchanges (codec/tools.examples) are what
    # make the model write a call on the first turn; without them it answers in prose
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[LOOKUP], temperature=0, max_tokens=60)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert json.loads(c.message.tool_calls[0].function.arguments) == {"account": "acct-4821"}


def test_auto_gives_a_call_once_the_model_opens_one(client):
    r = client.chat.completions.create(model=MODEL, messages=HISTORY, tools=[LOOKUP], temperature=0, max_tokens=60)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert [t.function.name for t in c.message.tool_calls] == ["lookup_code"]
    assert json.loads(c.message.tool_calls[0].function.arguments) == {"account": "acct-4821"}
    assert not c.message.content


def test_auto_sampled_calls_are_always_well_formed(client):
    # at temperature 1 the model opens calls it would not finish well-formed; from the marker
    # on the grammar holds it to a call of the tool, with exactly its arguments
    calls = 0
    seeds = range(12, 20)  # unconstrained, seed 16 wrote a "call" of no tool with no arguments
    replies = each(lambda seed: client.chat.completions.create(
        model=MODEL, messages=HISTORY, tools=[LOOKUP], temperature=1.0, seed=seed, max_tokens=60,
        parallel_tool_calls=False), seeds)
    for seed, r in zip(seeds, replies, strict=True):
        calls += check_calls(r.choices[0], seed)
    assert calls >= 4, calls


def test_auto_streamed_gives_the_same_call(client):
    kw = dict(model=MODEL, messages=HISTORY, tools=[LOOKUP], temperature=0, max_tokens=60)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    args, names, finish, content = "", [], None, ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for t in ch.delta.tool_calls or []:
                if t.function and t.function.name:
                    names.append(t.function.name)
                args += (t.function.arguments or "") if t.function else ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls" and names == ["lookup_code"]
    assert json.loads(args) == json.loads(whole[0].function.arguments) == {"account": "acct-4821"}
    assert content == ""
