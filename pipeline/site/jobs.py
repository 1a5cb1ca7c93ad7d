"""The built-in job types (seed 4.1) as frozen attrs classes.

Each is stored as ``job_type`` + a JSON payload of its fields; the names used in the
``job_type`` column are given in :data:`BUILTIN_JOB_TYPES`. ``ImageOperation`` keeps
the seed's externally tagged shape: ``{"Resize": {"width": 800, "height": 600}}`` and
``{"Compress": {"quality": 80}}`` (:func:`register_hooks` teaches a registry's converter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs
import cattrs
from attrs import validators as v
from cattrs.gen import make_dict_structure_fn

_positive = [v.instance_of(int), v.gt(0)]

# Bounds of one process_image job, checked when it is enqueued (exit 2 / 422 naming them): the
# work a job can ask for is bounded before it reaches an image thread, which a timeout
# can stop only between operations (images.py).
MAX_OPERATIONS = 16  # operations in one process_image job
MAX_SIDE = 16_384  # pixels, for Resize's width and height (WebP's own limit; IMAGE_MAX_PIXELS also applies)


def _strings(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def _tuple_of(items: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(items)


@attrs.frozen
class SendEmail:
    to: str
    subject: str
    body: str


@attrs.frozen
class SendWelcomeEmail:
    user_id: str
    email: str
    username: str


@attrs.frozen
class Resize:
    width: int = attrs.field(validator=[*_positive, v.le(MAX_SIDE)])
    height: int = attrs.field(validator=[*_positive, v.le(MAX_SIDE)])


@attrs.frozen
class Compress:
    quality: int = attrs.field(validator=[v.instance_of(int), v.ge(1), v.le(100)])


ImageOperation = Resize | Compress


@attrs.frozen
class ProcessImage:
    media_id: str
    operations: tuple[ImageOperation, ...] = attrs.field(converter=_tuple_of, validator=v.max_len(MAX_OPERATIONS))


@attrs.frozen
class GenerateThumbnail:
    media_id: str
    size: int = attrs.field(validator=_positive)


@attrs.frozen
class ConvertWebP:
    media_id: str


@attrs.frozen
class ScheduledPublish:
    post_id: str


@attrs.frozen
class WebhookNotify:
    url: str
    payload: Any


@attrs.frozen
class RebuildSearchIndex:
    post_ids: tuple[str, ...] = attrs.field(converter=_strings, factory=tuple)


@attrs.frozen
class InvalidateCache:
    keys: tuple[str, ...] = attrs.field(converter=_strings)


@attrs.frozen
class GenerateSitemap:
    pass


BUILTIN_JOB_TYPES: dict[str, type] = {
    "send_email": SendEmail,
    "send_welcome_email": SendWelcomeEmail,
    "process_image": ProcessImage,
    "generate_thumbnail": GenerateThumbnail,
    "convert_webp": ConvertWebP,
    "scheduled_publish": ScheduledPublish,
    "webhook_notify": WebhookNotify,
    "rebuild_search_index": RebuildSearchIndex,
    "invalidate_cache": InvalidateCache,
    "generate_sitemap": GenerateSitemap,
}


def register_hooks(conv: cattrs.Converter) -> None:
    """The seed's externally tagged ImageOperation: {"Resize": {...}} | {"Compress": {...}}."""
    ops: dict[str, type] = {"Resize": Resize, "Compress": Compress}
    fns: dict[str, Callable[..., Any]] = {tag: make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True) for tag, cls in ops.items()}

    def structure_op(value: Any, _type: Any) -> Any:
        if not isinstance(value, dict) or len(value) != 1:
            raise TypeError('an image operation is {"Resize": {"width", "height"}} or {"Compress": {"quality"}}')
        ((tag, body),) = value.items()
        if tag not in ops:
            raise TypeError(f"unknown image operation {tag!r}; expected Resize or Compress")
        return fns[tag](body, ops[tag])

    conv.register_structure_hook(ImageOperation, structure_op)
    for tag, cls in ops.items():
        conv.register_unstructure_hook(cls, _tagged(tag))


def _tagged(tag: str) -> Callable[[Any], dict[str, Any]]:
    def unstructure(op: Any) -> dict[str, Any]:
        return {tag: attrs.asdict(op)}

    return unstructure
