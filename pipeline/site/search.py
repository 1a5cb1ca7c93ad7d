"""The ``rebuild_search_index`` handler and the search the ``search`` command runs.

The index is the FTS5 table ``posts_fts`` (migration 2 says why it keeps its own copy of
title and body). Only published posts are in it: refreshing a post re-reads its row, so
a post that was deleted, taken back to draft or not yet published loses its entry. An
empty ``post_ids`` rebuilds the whole index, e.g. after a bulk import:

    python -m pipeline enqueue rebuild_search_index --payload '{"post_ids": []}'
    python -m pipeline search 'trio AND "structured concurrency"'

The query is FTS5 syntax: words (all must match), ``"a phrase"``, ``prefix*``, ``OR``,
``NOT``, ``title:word``. Words are matched by stem (``publish`` finds "published") and
without accents.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import TYPE_CHECKING, TextIO

from . import content_store
from .content_db import RESOURCE as CONTENT
from .jobs import RebuildSearchIndex

if TYPE_CHECKING:
    from ..context import JobContext

log = logging.getLogger("pipeline.search")


async def rebuild_search_index(job: RebuildSearchIndex, ctx: JobContext) -> None:
    result = await ctx.resources[CONTENT].run(content_store.refresh_search, job.post_ids)
    if result.full:
        log.info("search index rebuilt: %d published posts (%d rows replaced)", result.indexed, result.removed)
    else:
        log.info(
            "search index refreshed for %d posts: %d indexed, %d not published (absent from the index)",
            len(set(job.post_ids)), result.indexed, len(set(job.post_ids)) - result.indexed,
        )


def print_search(conn: sqlite3.Connection, query: str, *, limit: int, out: TextIO) -> int:
    """The ``search`` command's output: one block per hit, then the count. Exit status 0."""
    hits = content_store.search(conn, query, limit=limit)
    if not hits:
        print("no hits", file=out)
        return 0
    for hit in hits:
        print(f"{hit.id}  {hit.title}", file=out)
        print(f"    {' '.join(hit.snippet.split())}", file=out)
    print(f"{len(hits)} hit{'s' if len(hits) != 1 else ''}" + (f" (showing the best {limit})" if len(hits) == limit else ""), file=out)
    return 0
