"""Domain events the business code emits (seed 8), and their routes to jobs (DESIGN 5).

Routes are plain functions ``(event, config) -> list of jobs``; the Enqueuer applies
them. An application adds its own events and routes through ``Registry.add_event``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ..clock import to_ts
from ..registry import Routed
from . import jobs
from .settings import WebhookSettings

if TYPE_CHECKING:
    from ..config import Config


@attrs.frozen
class PostCreated:
    id: str


@attrs.frozen
class PostScheduled:
    id: str
    publish_at: str = attrs.field()  # ISO 8601; the scheduled_publish job runs then

    @publish_at.validator
    def _parses(self, attribute: Any, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"publish_at must be an ISO 8601 string, got {type(value).__name__}")
        try:
            to_ts(value)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"publish_at {value!r} is not an ISO 8601 time between 1970 and 9999 ({exc})") from None


@attrs.frozen
class PostPublished:
    id: str


@attrs.frozen
class UserRegistered:
    user_id: str
    email: str
    username: str


@attrs.frozen
class MediaUploaded:
    id: str


def _webhooks(event_name: str, data: dict[str, Any], config: Config) -> list[Routed]:
    body = {"event": event_name, "data": data}
    return [Routed(jobs.WebhookNotify(url=url, payload=body)) for url in config.section(WebhookSettings).urls]


def route_post_created(event: PostCreated, config: Config) -> list[Routed]:
    return [
        Routed(jobs.RebuildSearchIndex(post_ids=(event.id,))),
        *_webhooks("PostCreated", {"id": event.id}, config),
        Routed(jobs.InvalidateCache(keys=(f"post:{event.id}", "posts:index"))),
    ]


def route_post_published(event: PostPublished, config: Config) -> list[Routed]:
    return [
        Routed(jobs.RebuildSearchIndex(post_ids=(event.id,))),
        Routed(jobs.GenerateSitemap()),
        Routed(jobs.InvalidateCache(keys=(f"post:{event.id}", "posts:index", "sitemap"))),
    ]


def route_post_scheduled(event: PostScheduled, config: Config) -> list[Routed]:
    return [Routed(jobs.ScheduledPublish(post_id=event.id), run_after=event.publish_at)]


def route_user_registered(event: UserRegistered, config: Config) -> list[Routed]:
    return [Routed(jobs.SendWelcomeEmail(user_id=event.user_id, email=event.email, username=event.username))]


def route_media_uploaded(event: MediaUploaded, config: Config) -> list[Routed]:
    return [
        Routed(jobs.GenerateThumbnail(media_id=event.id, size=300)),
        Routed(jobs.ConvertWebP(media_id=event.id)),
    ]


BUILTIN_EVENTS: dict[str, tuple[type, Any]] = {
    "PostCreated": (PostCreated, route_post_created),
    "PostScheduled": (PostScheduled, route_post_scheduled),
    "PostPublished": (PostPublished, route_post_published),
    "UserRegistered": (UserRegistered, route_user_registered),
    "MediaUploaded": (MediaUploaded, route_media_uploaded),
}
