"""Typed messages: frozen dataclass records and one table-driven codec for both links.

A record's body on the wire is a msgpack map of its fields by name (the bodies Link F has
always carried), so a new field with a default is compatible both ways: an older peer
ignores it, a newer one fills the default. Each field's converter is derived once from its
type annotation (int, float, str, bytes, bool, object, bare list / dict, `X | None`,
`tuple[X, ...]`, fixed `tuple[X, Y]`, `dict[K, V]`, a nested record); decoding checks every
field and answers anything malformed with a ProtocolError, never a KeyError or TypeError.

A Table maps message types to the classes that carry them (records, or any class with
`to_wire()` / `from_wire(w)` like plan.StepPlan); types in it without a class carry a raw
map, left to their handler to check. A `deferred` class is sent typed but decoded by its
handler (`Cls.from_wire(body)`), which can answer a malformed one instead of losing the link."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar

from ..errors import ProtocolError

Conv = tuple[Callable[[Any], Any], Callable[[Any], Any]]  # (to the wire, from the wire)


class Malformed(ValueError):
    pass


def _check(ok: bool, what: str, v: Any) -> None:
    if not ok:
        raise Malformed(f"expected {what}, got {type(v).__name__}")


def _scalar(tp: type) -> Conv:
    def dec(v: Any) -> Any:
        if tp is float:
            _check(isinstance(v, (int, float)) and not isinstance(v, bool), "a number", v)
            return float(v)
        if tp is int:
            _check(isinstance(v, int) and not isinstance(v, bool), "an integer", v)
        else:
            _check(isinstance(v, tp), tp.__name__, v)
        return v
    return (lambda v: v), dec


def _conv(tp: Any) -> Conv:
    if tp in (int, float, str, bytes, bool, list, dict):
        return _scalar(tp)
    if tp in (object, Any):
        return (lambda v: v), (lambda v: v)
    if dataclasses.is_dataclass(tp):
        return (lambda v: v.to_wire()), tp.from_wire  # type: ignore[union-attr]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {tp}")
        enc, dec = _conv(inner[0])
        return (lambda v: None if v is None else enc(v)), (lambda v: None if v is None else dec(v))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        enc, dec = _conv(args[0])

        def dec_all(v: Any) -> tuple:
            _check(isinstance(v, (list, tuple)), "a list", v)
            return tuple(dec(x) for x in v)
        return (lambda v: [enc(x) for x in v]), dec_all
    if origin is tuple:
        convs = [_conv(a) for a in args]

        def dec_fixed(v: Any) -> tuple:
            _check(isinstance(v, (list, tuple)) and len(v) == len(convs), f"a list of {len(convs)}", v)
            return tuple(d(x) for (_, d), x in zip(convs, v, strict=True))
        return (lambda v: [e(x) for (e, _), x in zip(convs, v, strict=True)]), dec_fixed
    if origin is dict:
        (ke, kd), (ve, vd) = _conv(args[0]), _conv(args[1])

        def dec_map(v: Any) -> dict:
            _check(isinstance(v, dict), "a map", v)
            return {kd(k): vd(x) for k, x in v.items()}
        return (lambda v: {ke(k): ve(x) for k, x in v.items()}), dec_map
    raise TypeError(f"no wire converter for {tp!r}")


_FIELDS: dict[type, list[tuple[str, Conv, bool, bool]]] = {}


def _fields(cls: type) -> list[tuple[str, Conv, bool, bool]]:
    """The codec's table for one record class: (name, converters, required, left off the
    wire when None), built once."""
    got = _FIELDS.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls)
        got = _FIELDS[cls] = [
            (f.name, _conv(hints[f.name]),
             f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.default is None)
            for f in dataclasses.fields(cls)]
    return got


class Record:
    """Base of the typed messages (subclasses are frozen dataclasses). TYPE is the message
    type it travels as (0: a record only ever nested in another)."""
    TYPE: ClassVar[int] = 0

    def to_wire(self) -> dict:
        """The map of its fields; a field whose default is None is left off while None."""
        out = {}
        for name, (enc, _), _, omit in _fields(type(self)):
            v = getattr(self, name)
            if not (omit and v is None):
                out[name] = enc(v)
        return out

    @classmethod
    def from_wire(cls, w: Any) -> Any:
        if not isinstance(w, dict):
            raise ProtocolError(f"{cls.__name__} has a malformed body (not a map)")
        kw = {}
        for name, (_, dec), required, _ in _fields(cls):
            if name not in w:
                if required:
                    raise ProtocolError(f"{cls.__name__} has a malformed body (no field {name!r})")
                continue
            try:
                kw[name] = dec(w[name])
            except (Malformed, ProtocolError, TypeError, ValueError) as e:
                why = e.message if isinstance(e, ProtocolError) else str(e)
                raise ProtocolError(f"{cls.__name__} has a malformed body (field {name!r}: {why})") from None
        return cls(**kw)


class Table:
    """Message type <-> the class that carries it, for one link."""

    def __init__(self, classes: dict[int, Any], deferred: tuple[type[Record], ...] = ()):
        self.classes = {**classes, **{c.TYPE: None for c in deferred}}
        self.types = {c: t for t, c in classes.items() if c is not None} | {c: c.TYPE for c in deferred}

    def __contains__(self, msg_type: int) -> bool:
        return msg_type in self.classes

    def type_of(self, msg: Any) -> int:
        try:
            return self.types[type(msg)]
        except KeyError:
            raise TypeError(f"{type(msg).__name__} is not a message of this link") from None

    def decode(self, msg_type: int, body: Any) -> Any:
        """The typed message (or the raw body, for a type without a class)."""
        cls = self.classes[msg_type]
        if cls is None:
            return body
        if isinstance(cls, type) and issubclass(cls, Record):
            return cls.from_wire(body)
        try:
            return cls.from_wire(body)
        except (TypeError, ValueError, KeyError) as e:
            raise ProtocolError(f"{cls.__name__} has a malformed body ({type(e).__name__}: {e})") from None
