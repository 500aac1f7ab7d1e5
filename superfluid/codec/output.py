"""The output processor: sampled tokens become typed output, in this one place.

For each token it gives the content text, reasoning text and tool-call pieces it released
(`CallDelta`: start, argument fragments, end), the logprobs of the tokens whose text went to
the content (a token that was markup, reasoning or a call has none), and how the generation
ended. The session log stores exactly this, and every API stream, live or resumed,
translates it; nothing derives output from raw text a second time."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..request import CallDelta, FinishReason, TokenLogprob
from .channels import Channels, ChannelSpec
from .detok import TextStream


@dataclass(slots=True)
class Output:
    """What one token released."""
    text: str = ""
    reasoning: str = ""
    calls: list[CallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: FinishReason | None = None
    stop_sequence: str | None = None


class OutputProcessor:
    def __init__(self, text: TextStream, spec: ChannelSpec | None):
        self.text = text
        self.channels = Channels(spec) if spec is not None else None
        self._pending: list[TokenLogprob] = []  # logprobs of tokens whose text is held back

    def replay(self, tokens: tuple[int, ...]) -> None:
        """Tokens this turn produced before (a continuation, a failover): the text and
        channel state pick up where they were; nothing is released."""
        for t in tokens:
            text = self.text.push(t)
            if self.channels is not None:
                self.channels.feed(text)

    def token(self, token: int, finish: FinishReason | None, logprob: TokenLogprob | None = None) -> Output:
        """The output of a sampled token; the last one flushes what is held back."""
        out = Output(finish=finish)
        text = self.text.push(token)
        if self.text.stopped_by is not None:
            out.finish, out.stop_sequence = FinishReason.STOP_SEQUENCE, self.text.stopped_by
        elif finish is not None:
            text += self.text.finish()
        if self.channels is None:
            out.text = text
            if logprob is not None:
                out.logprobs.append(logprob)
            return out
        parts = self.channels.feed(text)
        if out.finish is not None:
            end = self.channels.finish()
            parts.content += end.content
            parts.reasoning += end.reasoning
            parts.calls += end.calls
        out.text, out.reasoning, out.calls = parts.content, parts.reasoning, parts.calls
        if logprob is not None:
            self._pending.append(logprob)
        if out.finish is not None:  # everything is out now
            out.logprobs, self._pending = (self._pending if out.text else []), []
            return out
        hidden, holding = self.channels.hidden, self.channels.holding
        if out.text and (hidden or holding):  # this token's text runs on into (what may be) markup
            last = self._pending[-1:] if logprob is not None else []
            out.logprobs = self._pending[:len(self._pending) - len(last)]
            self._pending = [] if hidden else last
        elif out.text:  # the held tokens turned out to be content
            out.logprobs, self._pending = self._pending, []
        elif hidden or out.reasoning or out.calls or (text and not holding):
            self._pending = []  # they were markup, reasoning or a call
        return out
