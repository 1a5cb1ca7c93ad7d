"""Every SQL statement the publishing, search and sitemap handlers run on the content tables.

The tables are migration 2's (users, posts, media, posts_fts, post_publications). Like
the job store's SQL, these are plain synchronous functions taking an open
connection; the handlers run them in a thread of the ``"content"`` resource (content_db.py). The
ones that write open their own ``write_transaction`` (BEGIN IMMEDIATE), so they queue
behind the Ledger's batches on SQLite's lock instead of failing.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

import attrs

from ..errors import UsageError
from ..sqlite_files import write_transaction

# A post scheduled for T is due at T; this much early still counts as due. The job's
# run_after is publish_at cut to milliseconds, and clocks of two processes differ a little.
PUBLISH_SLACK_SECONDS = 1.0

# snippet(): the markers around each matched word, the ellipsis, the snippet's length in tokens.
SNIPPET_OPEN, SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_TOKENS = "[", "]", "…", 12

# How SQLite words a bad FTS5 query (as opposed to a database that failed).
_QUERY_ERRORS = ("fts5:", "unterminated string", "no such column", "unknown special query")


# -- publishing -----------------------------------------------------------------------------


@attrs.frozen
class PublishResult:
    """What ``publish_scheduled`` found. ``outcome`` is one of:

    published          this call published the post
    published_earlier  an earlier attempt of this same job published it
    already_published  published by someone else (the host application, another job)
    draft              taken back to draft: not published
    not_due            still scheduled, but for later than now (rescheduled)
    unknown            no such post (deleted, or never existed)
    """

    outcome: str
    publish_at: str | None = None
    published_at: str | None = None


def publish_scheduled(conn: sqlite3.Connection, post_id: str, job_id: str, now: str) -> PublishResult:
    """Publish the post if it is still scheduled and due; record which job did it."""
    with write_transaction(conn):
        changed = conn.execute(
            "UPDATE posts SET status = 'published', published_at = :now, updated_at = :now "
            "WHERE id = :id AND status = 'scheduled' "
            # NULL or unreadable publish_at counts as due: the job's own run time decides
            "AND coalesce(julianday(publish_at), 0) <= julianday(:now) + :slack",
            {"id": post_id, "now": now, "slack": PUBLISH_SLACK_SECONDS / 86400},
        ).rowcount
        if changed:
            conn.execute(
                "INSERT OR REPLACE INTO post_publications (job_id, post_id, published_at) VALUES (?, ?, ?)",
                (job_id, post_id, now),
            )
            return PublishResult("published", published_at=now)
        row = conn.execute("SELECT status, publish_at, published_at FROM posts WHERE id = ?", (post_id,)).fetchone()
        if row is None:
            return PublishResult("unknown")
        status, publish_at, published_at = row
        if status == "published":
            mine = conn.execute(
                "SELECT 1 FROM post_publications WHERE job_id = ? AND post_id = ?", (job_id, post_id)
            ).fetchone()
            return PublishResult("published_earlier" if mine else "already_published", publish_at, published_at)
        return PublishResult("not_due" if status == "scheduled" else "draft", publish_at, published_at)


# -- search ---------------------------------------------------------------------------------


@attrs.frozen
class IndexRefresh:
    indexed: int  # rows written: the given posts that are published
    removed: int  # rows deleted before (re)indexing
    full: bool  # the whole index was rebuilt


@attrs.frozen
class SearchHit:
    id: str
    title: str
    snippet: str


def refresh_search(conn: sqlite3.Connection, post_ids: Sequence[str]) -> IndexRefresh:
    """Re-index the given posts: drop their rows, then add back those that are published.

    A deleted, draft or scheduled post ends with no row. An empty ``post_ids`` rebuilds
    the whole index from the published posts. The ids travel as one JSON array
    (``json_each``), so any number of them is one statement with one parameter.
    """
    with write_transaction(conn):
        if not post_ids:
            removed = conn.execute("DELETE FROM posts_fts").rowcount
            indexed = conn.execute(
                "INSERT INTO posts_fts (post_id, title, body) SELECT id, title, body FROM posts WHERE status = 'published'"
            ).rowcount
            conn.execute("INSERT INTO posts_fts (posts_fts) VALUES ('optimize')")  # merge the b-trees once, after a bulk load
            return IndexRefresh(indexed, removed, full=True)
        ids = json.dumps(list(dict.fromkeys(post_ids)))
        removed = conn.execute("DELETE FROM posts_fts WHERE post_id IN (SELECT value FROM json_each(?))", (ids,)).rowcount
        indexed = conn.execute(
            "INSERT INTO posts_fts (post_id, title, body) SELECT id, title, body FROM posts "
            "WHERE status = 'published' AND id IN (SELECT value FROM json_each(?))",
            (ids,),
        ).rowcount
        return IndexRefresh(indexed, removed, full=False)


def indexed_post_ids(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute("SELECT post_id FROM posts_fts ORDER BY post_id")]


def search(conn: sqlite3.Connection, query: str, *, limit: int = 20) -> list[SearchHit]:
    """Published posts matching an FTS5 query, best first; UsageError if the query is malformed.

    The join with ``posts`` keeps a post out of the results as soon as it stops being
    published, even before rebuild_search_index has removed its row.
    """
    if not query.strip():
        raise UsageError("the search query is empty; give one or more words")
    try:
        rows = conn.execute(
            # snippet column -1: whichever column matched best; bm25 weights per column
            # (post_id, title, body): a word in the title ranks a post higher
            "SELECT posts_fts.post_id, posts_fts.title, snippet(posts_fts, -1, ?, ?, ?, ?) "
            "FROM posts_fts JOIN posts ON posts.id = posts_fts.post_id "
            "WHERE posts_fts MATCH ? AND posts.status = 'published' "
            "ORDER BY bm25(posts_fts, 0.0, 10.0, 1.0) LIMIT ?",
            (SNIPPET_OPEN, SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_TOKENS, query, limit),
        ).fetchall()
    except sqlite3.OperationalError as exc:
        if str(exc).startswith(_QUERY_ERRORS):
            raise UsageError(
                f"search query {query!r} is not valid FTS5 query syntax ({exc}); "
                "put words with punctuation in double quotes, e.g. '\"trio-nursery\"', "
                'and close every quote and parenthesis'
            ) from None
        raise
    return [SearchHit(*row) for row in rows]


# -- sitemap --------------------------------------------------------------------------------


def published_for_sitemap(conn: sqlite3.Connection) -> list[tuple[str, str | None]]:
    """(slug, updated_at) of every published post, in publication order (stable parts)."""
    return conn.execute(
        "SELECT slug, updated_at FROM posts WHERE status = 'published' ORDER BY published_at, id"
    ).fetchall()
