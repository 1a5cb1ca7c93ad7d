"""What a payload, an event or a result can hold, and its JSON form (docs/jobs.md, "Payload types":
the table, and what each form keeps and loses).

The registry's one cattrs converter is built here (:func:`make_converter`), used only at the edges
(database rows, HTTP, CLI). Structuring is strict: a string where an int is expected, a missing field
or an unknown key is refused with a message that names the field. Beyond JSON's own types, each type
has one form, so that every process, the CLI, the admin API and an operator's ``->>`` read the same
text: a datetime as ISO 8601 with its offset (a naive one refused), a date or a time as ISO 8601, a
timedelta as seconds, a UUID and a Decimal as text, an Enum as its value, a set as a sorted array,
bytes as base64, a pydantic model as ``model_dump(mode="json")`` (its own rules).

Types the table lacks take a hook: ``pipeline.Registry(converter=...)`` takes a cattrs ``Converter``
whose hooks serve every other type; the pipeline copies it (the caller's object is not changed) and
registers the table's hooks on the copy, so the forms above hold whatever the base does. A payload
or event class with a field of a type that has neither a form here nor a hook is refused at
registration (:func:`check_payload`), naming the class, the field and the type.

pydantic is never imported here: a class is a pydantic model only if pydantic is already imported
(by the application that defined it).
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import sys
import types
import typing
import uuid
from collections import abc
from collections.abc import Callable
from typing import Any

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory, is_any_set, is_sequence, list_structure_factory
from cattrs.errors import StructureHandlerNotFoundError
from cattrs.fns import identity


def hook_hint(which: str, type_: Any) -> str:
    """How to give ``type_`` a JSON form: ``which`` hooks on the converter the registry is built on."""
    return (f"register {which} for {show(type_)} on a cattrs.Converter and pass it as pipeline.Registry(converter=...) "
            "(docs/jobs.md, \"Payload types\")")


_NATIVE = (str, int, float, bool, type(None))  # JSON's own: stored as they are
# the table's types beyond JSON's (a subclass is stored as its base, and read back as the base)
TABLE = (dt.datetime, dt.date, dt.time, dt.timedelta, uuid.UUID, decimal.Decimal, bytes, bytearray)
_TEXT_FORMS = (str, uuid.UUID, dt.date, dt.time, decimal.Decimal)  # what may key an object (datetime is a date)


# -- the converter ---------------------------------------------------------------------------


def make_converter(base: cattrs.Converter | None = None) -> cattrs.Converter:
    """The registry's converter: ``base`` copied (or a new one), with the pipeline's hooks on top."""
    if base is None:
        conv = cattrs.Converter(forbid_extra_keys=True)
    elif isinstance(base, cattrs.Converter):
        # unknown keys are refused whatever the base says: a misspelt field is an error, not a default
        conv = base.copy(forbid_extra_keys=True)
    else:
        raise TypeError(f"Registry(converter=...) takes a cattrs.Converter, got {type(base).__name__}")
    conv.register_structure_hook_factory(
        lambda t: is_sequence(t) or is_any_set(t) or _origin(t) is tuple, _arrays_only(conv)
    )
    conv.register_structure_hook(str, _strict(str, "a string"))
    conv.register_structure_hook(int, _strict(int, "an integer"))
    conv.register_structure_hook(bool, _strict(bool, "a boolean"))
    conv.register_structure_hook(float, lambda v, _: float(_strict((int, float), "a number")(v, _)))
    conv.register_structure_hook(Any, lambda v, _: v)
    conv.register_structure_hook_func(lambda t: t is object, lambda v, _: v)  # anything, as JSON gives it
    conv.register_structure_hook_factory(_is_native_union, _native_union)

    conv.register_unstructure_hook(dt.datetime, _unstructure_datetime)
    conv.register_structure_hook(dt.datetime, _structure_datetime)
    conv.register_unstructure_hook(dt.date, _unstructure_date)
    conv.register_structure_hook(dt.date, _structure_date)
    conv.register_unstructure_hook(dt.time, _unstructure_time)
    conv.register_structure_hook(dt.time, _structure_time)
    conv.register_unstructure_hook(dt.timedelta, _unstructure_timedelta)
    conv.register_structure_hook(dt.timedelta, _structure_timedelta)
    conv.register_unstructure_hook(uuid.UUID, str)
    conv.register_structure_hook(uuid.UUID, _structure_uuid)
    conv.register_unstructure_hook(decimal.Decimal, _unstructure_decimal)
    conv.register_structure_hook(decimal.Decimal, _structure_decimal)
    conv.register_unstructure_hook(bytes, _unstructure_bytes)
    conv.register_structure_hook(bytes, _structure_bytes)
    conv.register_unstructure_hook(bytearray, _unstructure_bytes)
    conv.register_structure_hook(bytearray, lambda v, _: bytearray(_structure_bytes(v, _)))
    conv.register_unstructure_hook_factory(is_any_set, _unstructure_set(conv))
    conv.register_unstructure_hook_factory(_is_pydantic_model, lambda _: _unstructure_pydantic)
    conv.register_structure_hook_factory(_is_pydantic_model, _structure_pydantic)
    return conv


def _origin(type_: Any) -> Any:
    return typing.get_origin(type_)  # (typeshed types the result too narrowly to compare with tuple)


def _strict(kind: type | tuple[type, ...], label: str) -> Callable[[Any, Any], Any]:
    def structure(value: Any, type_: Any) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {label}, got a boolean")
        if not isinstance(value, kind):
            raise TypeError(f"expected {label}, got {type(value).__name__}")
        # an IntEnum or a StrEnum reaches here (int and str come before Enum in its MRO): the member
        if type_ is not kind and isinstance(type_, type) and issubclass(type_, enum.Enum):
            return type_(value)
        return value

    return structure


def _arrays_only(conv: cattrs.Converter) -> Callable[[Any], Callable[[Any, Any], Any]]:
    """Sequences and sets from JSON arrays alone: cattrs would take any iterable, so that
    ``{"keys": "post:1"}`` became the keys ``("p", "o", "s", ...)`` and an object its keys."""

    def factory(type_: Any) -> Callable[[Any, Any], Any]:
        # the hook cattrs itself would choose, for each kind of collection
        origin = typing.get_origin(type_) or type_
        args = typing.get_args(type_)
        inner: Callable[[Any, Any], Any]
        if origin is tuple and args and args[1:] != (Ellipsis,):
            inner = conv.gen_structure_hetero_tuple(type_)  # tuple[int, str]
        elif origin is collections.deque:
            inner = conv._structure_deque
        elif origin in (list, abc.MutableSequence):
            inner = list_structure_factory(type_, conv)
        elif origin in (set, abc.MutableSet):
            inner = conv._structure_set
        elif origin in (frozenset, abc.Set):
            inner = conv._structure_frozenset
        else:  # tuple[X, ...], bare tuple, abstract Sequence: a tuple
            inner = homogenous_tuple_structure_factory(type_, conv)

        def structure(value: Any, type_: Any) -> Any:
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"expected an array, got {type(value).__name__}")
            return inner(value, type_)

        return structure

    return factory


def _arms(type_: Any) -> tuple[Any, ...] | None:
    """The arms of a union (``X | Y`` or ``Union[X, Y]``), or None if it is not one."""
    if typing.get_origin(type_) in (typing.Union, types.UnionType):
        return typing.get_args(type_)
    return None


def _is_native_union(type_: Any) -> bool:
    arms = _arms(type_)
    return arms is not None and all(arm in _NATIVE for arm in arms) and len([a for a in arms if a is not type(None)]) > 1


def _native_union(type_: Any) -> Callable[[Any, Any], Any]:
    """``int | str`` and the like: the value is taken if its JSON type is one of the arms (a
    boolean is not an integer here either); an integer for a float arm becomes a float."""
    arms = typing.get_args(type_)
    label = " | ".join("null" if arm is type(None) else arm.__name__ for arm in arms)

    def structure(value: Any, _: Any) -> Any:
        if type(value) in arms:
            return value
        if type(value) is int and float in arms:
            return float(value)
        raise TypeError(f"expected {label}, got {'a boolean' if isinstance(value, bool) else type(value).__name__}")

    return structure


def _text(value: Any, label: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected {label}, got {type(value).__name__}")
    return value


def _unstructure_datetime(value: dt.datetime) -> str:
    if value.utcoffset() is None:
        raise ValueError(f"the datetime {value.isoformat()} is naive (it has no timezone), so which instant it names "
                         "depends on the reader's zone: give it one, e.g. datetime.now(timezone.utc) or "
                         ".replace(tzinfo=ZoneInfo(...))")
    return value.isoformat()


def _structure_datetime(value: Any, _: Any) -> dt.datetime:
    text = _text(value, "an ISO 8601 date and time with its offset")
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected an ISO 8601 date and time with its offset, like '2024-05-01T09:30:00+00:00', "
                         f"got {text!r:.60}") from None
    if parsed.utcoffset() is None:
        raise ValueError(f"{text!r:.60} has no offset (a naive time names no instant): add one, like "
                         "'2024-05-01T09:30:00+00:00' or '...Z'")
    return parsed


def _unstructure_date(value: dt.date) -> str:
    if isinstance(value, dt.datetime):  # a field declared date, given a datetime: its time would be lost
        raise ValueError(f"a datetime ({value.isoformat()}) where a date is declared: pass its .date(), or declare datetime")
    return value.isoformat()


def _structure_date(value: Any, _: Any) -> dt.date:
    text = _text(value, "an ISO 8601 date")
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected an ISO 8601 date, like '2024-05-01', got {text!r:.60}") from None


def _unstructure_time(value: dt.time) -> str:
    if value.tzinfo is not None and value.utcoffset() is None:
        raise ValueError(f"the time {value} has a zone ({value.tzinfo}) but no offset (a zone's offset depends on the "
                         "date): use a datetime, a fixed offset (timezone(timedelta(hours=2))) or a naive time")
    return value.isoformat()


def _structure_time(value: Any, _: Any) -> dt.time:
    text = _text(value, "an ISO 8601 time")
    try:
        return dt.time.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected an ISO 8601 time, like '09:30:00' or '09:30:00+02:00', got {text!r:.60}") from None


def _unstructure_timedelta(value: dt.timedelta) -> int | float:
    micro = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    whole, part = divmod(micro, 1_000_000)
    return whole if not part else micro / 1_000_000


def _structure_timedelta(value: Any, _: Any) -> dt.timedelta:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number of seconds, got {'a boolean' if isinstance(value, bool) else type(value).__name__}")
    try:
        return dt.timedelta(seconds=value)
    except OverflowError:
        raise ValueError(f"{value!r:.40} seconds is out of timedelta's range") from None


def _structure_uuid(value: Any, _: Any) -> uuid.UUID:
    text = _text(value, "a UUID as text")
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ValueError(f"expected a UUID, like '0b7e6f3a-...', got {text!r:.60}") from None


def _unstructure_decimal(value: decimal.Decimal) -> str:
    if value.is_nan():  # NaN is not equal to itself: stored, it could never be compared back
        raise ValueError(f"the Decimal {value} cannot be stored (it is equal to nothing, itself included)")
    return str(value)


def _structure_decimal(value: Any, _: Any) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"expected a decimal number as text, got {'a boolean' if isinstance(value, bool) else type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a decimal number, got {value!r}")
    try:
        # a JSON number is read by its shortest repr: 9.99 is Decimal("9.99"), not the binary 9.9900000000000002131...
        parsed = decimal.Decimal(repr(value) if isinstance(value, float) else value)
    except decimal.InvalidOperation:
        raise ValueError(f"expected a decimal number as text, like '12.50', got {value!r:.60}") from None
    if parsed.is_nan():
        raise ValueError(f"expected a decimal number, got {value!r:.20}")
    return parsed


def _unstructure_bytes(value: bytes | bytearray) -> str:
    return base64.b64encode(value).decode("ascii")


def _structure_bytes(value: Any, _: Any) -> bytes:
    text = _text(value, "base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"expected standard base64 text (with its padding), got {text!r:.60}") from None


def _unstructure_set(conv: cattrs.Converter) -> Callable[[Any], Callable[[Any], list[Any]]]:
    """A set as an array (json has no set), sorted when its items' forms sort, so that the same set
    is the same text (a unique key, a payload compared by an operator)."""

    def factory(type_: Any) -> Callable[[Any], list[Any]]:
        args = typing.get_args(type_)
        item = conv.get_unstructure_hook(args[0]) if args and args[0] is not Any else conv.unstructure

        def unstructure(value: Any) -> list[Any]:
            items = [item(v) for v in value]
            try:
                items.sort()
            except TypeError:  # mixed or unorderable forms (objects): as iterated
                pass
            return items

        return unstructure

    return factory


# -- pydantic, never imported here -----------------------------------------------------------


def _pydantic() -> Any:
    return sys.modules.get("pydantic")


def is_pydantic_model(type_: Any) -> bool:
    """A pydantic v2 model class (pydantic imported by the application that defined it)."""
    pydantic = _pydantic()
    return pydantic is not None and isinstance(type_, type) and issubclass(type_, pydantic.BaseModel)


_is_pydantic_model = is_pydantic_model


def _unstructure_pydantic(model: Any) -> Any:
    # the JSON FastAPI answers for it: aliases as the model declares them; round_trip: a Json[...]
    # field is written so that it validates again
    return model.model_dump(mode="json", by_alias=True, round_trip=True)


def _structure_pydantic(type_: Any) -> Callable[[Any, Any], Any]:
    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, type_):
            return value
        pydantic = _pydantic()
        try:
            # JSON mode: what was stored is JSON, and a strict model takes an ISO string for a datetime there
            return type_.model_validate_json(json.dumps(value, ensure_ascii=False, allow_nan=False))
        except pydantic.ValidationError as exc:
            details = "; ".join(f"$.{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
                                for e in exc.errors(include_url=False))
            raise ValueError(details) from None

    return structure


# -- JSON text ---------------------------------------------------------------------------------


def compact_json() -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)`` at
    half the cost: json.JSONEncoder.encode builds its C encoder anew on every call, this
    builds it once (2.9 -> 1.3 us for a small payload). NaN and Infinity are refused: what
    is stored is JSON that any reader accepts. A circular payload ends in RecursionError. A value
    JSON has no form for raises TypeError naming its type and the hook that would give it one."""
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_no_form)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return encoder.encode
    c_encode = make(None, _no_form, json.encoder.encode_basestring, None, ":", ",", False, False, False)

    def to_json(value: Any) -> str:
        return "".join(c_encode(value, 0))

    return to_json


def _no_form(value: Any) -> Any:
    kind = type(value)
    raise TypeError(f"Object of type {kind.__qualname__} is not JSON serializable: {kind.__module__}.{kind.__qualname__} "
                    f"has no JSON form among the pipeline's types; {hook_hint('an unstructure hook', kind)}")


# -- what can be stored, checked at registration -----------------------------------------------


class Unstorable(Exception):
    """A type with no JSON form: ``where`` the field that holds it ("" for a return annotation),
    ``reason`` why and what to do."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.where = where
        self.reason = reason


def check_payload(conv: cattrs.Converter, cls: type) -> None:
    """Every field of a payload (or event) class, and theirs, has a JSON form: Unstorable naming the
    first that has none. A pydantic model is its own judge (it refuses a type it cannot validate)."""
    _check_class(conv, cls, [], set())


def check_result(conv: cattrs.Converter, type_: Any) -> None:
    """A handler's return annotation has a JSON form (Unstorable if not)."""
    _check(conv, type_, [], set())


def show(type_: Any) -> str:
    """A type as written in code: ``datetime``, ``dict[str, Point]``, ``Point | None``."""
    if type_ is type(None) or type_ is None:
        return "None"
    if type_ is Ellipsis:
        return "..."
    arms = _arms(type_)
    if arms is not None:
        return " | ".join(map(show, arms))
    origin, args = typing.get_origin(type_), typing.get_args(type_)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is not None and args:
        return f"{show(origin)}[{', '.join(map(show, args))}]"
    if isinstance(type_, type):
        return type_.__qualname__
    return repr(type_).replace("typing.", "")


def _check_class(conv: cattrs.Converter, cls: Any, path: list[str], seen: set[Any]) -> None:
    """``path``: the fields that lead here from the registered class (``Order.lines``)."""
    if cls in seen or is_pydantic_model(cls):
        return
    seen.add(cls)
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # NameError above all: a name that is not defined where the class is
        where = f"field {' → '.join(path)}" if path else ""
        raise Unstorable(where, f"the annotations of {cls.__qualname__} cannot be resolved ({type(exc).__name__}: {exc}): "
                                "define the types they name at module level, not under `if TYPE_CHECKING:`") from None
    if attrs.has(cls):
        names = [a.name for a in attrs.fields(cls)]
    elif dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    else:  # a TypedDict
        names = list(hints)
    for name in names:
        _check(conv, hints.get(name, Any), [*path, f"{cls.__qualname__}.{name}"], seen)


def _check(conv: cattrs.Converter, type_: Any, path: list[str], seen: set[Any], whole: Any = None) -> None:
    """Whether ``type_`` (``whole``, the annotation of the field ``path`` ends with, or a part of it)
    has a JSON form; Unstorable if not. ``path`` is empty for a return annotation."""
    whole = type_ if whole is None else whole

    def refuse(reason: str) -> Unstorable:
        return Unstorable(f"field {' → '.join(path)} ({show(whole)})" if path else "", reason)

    while True:  # what stands for another type
        if typing.get_origin(type_) is typing.Annotated:
            type_ = typing.get_args(type_)[0]
        elif hasattr(type_, "__supertype__"):  # NewType
            type_ = type_.__supertype__
        elif type(type_).__name__ == "TypeAliasType":  # `type X = ...` (3.12)
            type_ = type_.__value__
        else:
            break
    if type_ in (Any, object, None) or type_ in _NATIVE or isinstance(type_, typing.TypeVar):
        return
    origin = typing.get_origin(type_)
    args = typing.get_args(type_)
    if origin is typing.Literal:
        for value in args:
            if not isinstance(value, (*_NATIVE, enum.Enum)):
                raise refuse(f"{show(type_)} holds {value!r}, which has no JSON form")
        return
    arms = _arms(type_)
    if arms is not None:
        for arm in arms:
            _check(conv, arm, path, seen, whole)
        try:
            conv.get_structure_hook(type_)
        except StructureHandlerNotFoundError:
            raise refuse(f"cattrs cannot tell which arm of {show(type_)} a JSON value is (it tells apart JSON's own types, "
                         "one type and None, or attrs classes with distinct fields): use one type, or attrs classes, "
                         f"or {hook_hint('a structure hook', type_)}") from None
        return
    container = origin or type_
    if (isinstance(container, type) and issubclass(container, (abc.Mapping, abc.Collection))
            and not issubclass(container, (str, *TABLE)) and not _is_class_with_fields(container)):
        if issubclass(container, abc.Mapping):
            key, value = args if len(args) == 2 else (Any, Any)
            if not _text_form(key):
                raise refuse(f"its keys are {show(key)}, and a JSON object's keys are text: use str keys (or UUID, date, "
                             "datetime, time, Decimal, an Enum of text), or a list of pairs")
            _check(conv, value, path, seen, whole)
        else:
            for arg in args:
                if arg is not Ellipsis:
                    _check(conv, arg, path, seen, whole)
        return
    if isinstance(type_, type) and issubclass(type_, enum.Enum):
        wrong = [m for m in type_ if not isinstance(m.value, (str, int, float, bool))]
        if wrong and not _has_hooks(conv, type_):
            raise refuse(f"the value {wrong[0].value!r} of {type_.__qualname__}.{wrong[0].name} has no JSON form: give the "
                         f"enum's members text or number values, or {hook_hint('structure and unstructure hooks', type_)}")
        return
    if isinstance(type_, type) and issubclass(type_, (*TABLE, *_NATIVE)):
        return
    if _is_class_with_fields(container):  # a class, or a generic one (Box[int]: its fields as declared)
        _check_class(conv, container, path, seen)
        return
    if _has_hooks(conv, type_):
        return
    raise refuse(f"{show(type_)} has no JSON form among the pipeline's types and the converter has no hook for it: "
                 f"{hook_hint('structure and unstructure hooks', type_)}; or make {show(type_)} an attrs class or a "
                 "dataclass")


def _is_class_with_fields(cls: Any) -> bool:
    return isinstance(cls, type) and (attrs.has(cls) or dataclasses.is_dataclass(cls) or typing.is_typeddict(cls)
                                      or is_pydantic_model(cls))


def _text_form(key: Any) -> bool:
    """Whether a dict's key type is stored as text (a JSON object's keys are)."""
    if key in (Any, object) or isinstance(key, typing.TypeVar):
        return True  # what is not declared is not checked (dict[Any, ...]: JSON's keys, as written)
    if hasattr(key, "__supertype__"):
        return _text_form(key.__supertype__)
    if typing.get_origin(key) is typing.Literal:
        return all(isinstance(v, str) for v in typing.get_args(key))
    if isinstance(key, type) and issubclass(key, enum.Enum):
        return all(isinstance(m.value, str) for m in key)
    return isinstance(key, type) and issubclass(key, _TEXT_FORMS)


def _has_hooks(conv: cattrs.Converter, type_: Any) -> bool:
    """The converter (a caller's base) has hooks of its own for a type the table lacks: a structure
    hook, and an unstructure hook other than cattrs' default for it (which, for an enum, gives the
    member's value as it is)."""
    try:
        conv.get_structure_hook(type_)
    except Exception:  # StructureHandlerNotFoundError, or a hook factory that fails on this type: none
        return False
    hook = conv.get_unstructure_hook(type_)
    if hook is identity:
        return False
    try:
        default = cattrs.Converter().get_unstructure_hook(type_)
    except Exception:
        return True
    return getattr(hook, "__qualname__", hook) != getattr(default, "__qualname__", default)
