"""The ``scheduled_publish`` handler: publish a scheduled post when its time comes.

``PostScheduled {id, publish_at}`` routes to a ``scheduled_publish`` job delayed to
``publish_at``. When it runs, the post is published only if it is still scheduled and
due (``UPDATE posts ... WHERE id=? AND status='scheduled'``); otherwise the job
completes having done nothing, and the log says why: no such post, already published,
back to draft, or rescheduled to a later time (the PostScheduled event for that time
brings its own job). Publishing emits ``PostPublished``, which routes to
rebuild_search_index, generate_sitemap and invalidate_cache.

The UPDATE commits before the emit. If the emit fails (the pipeline is shutting down,
the database refused the new jobs) the job is retried, and its UPDATE then matches
nothing. So the publishing transaction also records the job's id in
``post_publications``: a retry that finds the post published *by this job* emits
``PostPublished`` again. The event may thus go out twice, never zero times; everything
it routes to is idempotent.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..clock import now_ts
from . import content_store
from .content_db import RESOURCE as CONTENT
from .events import PostPublished
from .jobs import ScheduledPublish

if TYPE_CHECKING:
    from ..context import JobContext

log = logging.getLogger("pipeline.publish")

_SKIPPED = {
    "unknown": "no such post (deleted?)",
    "already_published": "it is already published (published_at {published_at})",
    "draft": "it was taken back to draft",
    "not_due": "it is now scheduled for {publish_at}, later than now; the PostScheduled event for that time publishes it",
}


async def scheduled_publish(job: ScheduledPublish, ctx: JobContext) -> None:
    result = await ctx.resources[CONTENT].run(content_store.publish_scheduled, job.post_id, ctx.id, now_ts())
    if result.outcome == "published":
        log.info("published post %s (job %s)", job.post_id, ctx.id)
    elif result.outcome == "published_earlier":
        log.info("post %s was published by an earlier attempt of job %s, whose PostPublished did not go out; "
                 "emitting it now (attempt %d)", job.post_id, ctx.id, ctx.attempt)
    else:
        reason = _SKIPPED[result.outcome].format(publish_at=result.publish_at, published_at=result.published_at)
        log.info("post %s not published by job %s: %s", job.post_id, ctx.id, reason)
        return
    await ctx.emit(PostPublished(id=job.post_id))
