"""The ``generate_sitemap`` handler: ``PUBLIC_DIR/sitemap.xml`` of the published posts.

Each post's URL is ``SITE_URL + "/posts/" + slug`` (the slug percent-encoded where RFC
3986 requires it) and its ``lastmod`` is the post's ``updated_at`` as a W3C datetime in
UTC. PUBLIC_DIR is taken to be served at SITE_URL's root.

Up to 50,000 URLs (the sitemaps.org limit per file) make one ``<urlset>`` in
``sitemap.xml``. Past that, the URLs go to ``sitemap-1.xml``, ``sitemap-2.xml``, ... in
publication order (so a new post changes only the last part), and ``sitemap.xml``
becomes a ``<sitemapindex>`` of them. Every file is written to a temporary file in the
same folder and renamed over the old one, parts before the index, so a crawler never
reads a half-written file or an index naming a part not yet there; parts left over from
a larger earlier run are removed afterwards. The XML is built with ElementTree, which
escapes ``&``, ``<`` and quotes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import tempfile
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

from ..clock import UTC, parse_ts
from . import content_store
from .content_db import RESOURCE as CONTENT
from .jobs import GenerateSitemap
from .settings import SiteSettings

if TYPE_CHECKING:
    from ..context import JobContext

log = logging.getLogger("pipeline.sitemap")

SITEMAP_LIMIT = 50_000  # URLs per file, sitemaps.org
POST_PATH = "/posts/"
NAMESPACE = "http://www.sitemaps.org/schemas/sitemap/0.9"
INDEX_NAME = "sitemap.xml"
RESOURCE = "sitemap"
_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'
_PART = re.compile(r"^sitemap-([1-9][0-9]*)\.xml$")
# RFC 3986 path characters that need no escaping (unreserved, sub-delims, ":" and "@");
# everything else, including "/", space, "<" and non-ASCII, is percent-encoded
_PATH_SAFE = "-._~!$&'()*+,;=:@"


@attrs.frozen
class Entry:
    loc: str
    lastmod: str | None  # W3C datetime, or None when the row's time is unreadable


@attrs.frozen
class SitemapResult:
    urls: int
    files: tuple[str, ...]  # names written under PUBLIC_DIR, index last
    removed: tuple[str, ...]  # stale parts deleted


def post_url(site_url: str, slug: str, *, path: str = POST_PATH) -> str:
    return site_url.rstrip("/") + path + urllib.parse.quote(slug, safe=_PATH_SAFE)


def w3c_datetime(ts: str | None) -> str | None:
    """``2024-05-01T10:00:00.123Z`` (or any ISO 8601) as ``2024-05-01T10:00:00Z``."""
    if not ts:
        return None
    try:
        return parse_ts(ts).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, TypeError):
        return None


def entries_for(site_url: str, rows: Sequence[tuple[str, str | None]]) -> list[Entry]:
    return [Entry(post_url(site_url, slug), w3c_datetime(updated_at)) for slug, updated_at in rows]


def render(root_tag: str, child_tag: str, entries: Sequence[Entry]) -> bytes:
    """A ``<urlset>`` of ``<url>`` or a ``<sitemapindex>`` of ``<sitemap>``, as UTF-8 bytes."""
    root = ET.Element(root_tag, xmlns=NAMESPACE)
    for entry in entries:
        item = ET.SubElement(root, child_tag)
        ET.SubElement(item, "loc").text = entry.loc
        if entry.lastmod is not None:
            ET.SubElement(item, "lastmod").text = entry.lastmod
    ET.indent(root)
    return (_DECLARATION + ET.tostring(root, encoding="unicode") + "\n").encode("utf-8")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the web server must read it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_sitemap(
    public_dir: Path, site_url: str, rows: Sequence[tuple[str, str | None]], *, limit: int = SITEMAP_LIMIT
) -> SitemapResult:
    """Write the sitemap of ``rows`` (slug, updated_at) under ``public_dir``. Blocking: run in a thread."""
    if limit < 1:
        raise ValueError(f"sitemap limit must be >= 1 URL per file, got {limit}")
    public_dir.mkdir(parents=True, exist_ok=True)
    entries = entries_for(site_url, rows)
    written: list[str] = []
    if len(entries) <= limit:
        parts = 0
        write_atomic(public_dir / INDEX_NAME, render("urlset", "url", entries))
    else:
        chunks = [entries[i : i + limit] for i in range(0, len(entries), limit)]
        parts = len(chunks)
        index = []
        for number, chunk in enumerate(chunks, 1):
            name = f"sitemap-{number}.xml"
            write_atomic(public_dir / name, render("urlset", "url", chunk))
            written.append(name)
            stamps = [e.lastmod for e in chunk if e.lastmod is not None]
            index.append(Entry(f"{site_url.rstrip('/')}/{name}", max(stamps) if stamps else None))
        write_atomic(public_dir / INDEX_NAME, render("sitemapindex", "sitemap", index))
    written.append(INDEX_NAME)
    removed = []
    for path in sorted(public_dir.iterdir()):
        match = _PART.match(path.name)
        if match and int(match.group(1)) > parts:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path.name)
    return SitemapResult(len(entries), tuple(written), tuple(removed))


@attrs.frozen
class SitemapWriter:
    """The ``"sitemap"`` resource: the thread limiter for file writing, and the URLs-per-file limit."""

    limiter: trio.CapacityLimiter
    limit: int = SITEMAP_LIMIT


@asynccontextmanager
async def open_sitemap_writer(limit: int = SITEMAP_LIMIT) -> AsyncIterator[SitemapWriter]:
    if limit < 1:
        raise ValueError(f"sitemap limit must be >= 1 URL per file, got {limit}")
    # one writer thread: the handler runs one job at a time anyway (concurrency=1), and
    # file writing must not take threads from the database or the image handlers
    yield SitemapWriter(trio.CapacityLimiter(1), limit)


async def generate_sitemap(job: GenerateSitemap, ctx: JobContext) -> None:
    site = ctx.config.section(SiteSettings)
    writer: SitemapWriter = ctx.resources[RESOURCE]
    rows = await ctx.resources[CONTENT].run(content_store.published_for_sitemap)
    public_dir = Path(site.public_dir)
    write = functools.partial(write_sitemap, public_dir, site.url, rows, limit=writer.limit)
    try:
        result = await trio.to_thread.run_sync(write, limiter=writer.limiter)
    except OSError as exc:  # retried: a full disk or a permission fixed by the operator can clear
        raise OSError(f"cannot write the sitemap under PUBLIC_DIR={str(public_dir)!r}: {exc}") from exc
    log.info(
        "sitemap: %d published posts in %s%s",
        result.urls, ", ".join(str(public_dir / name) for name in result.files),
        f"; removed stale {', '.join(result.removed)}" if result.removed else "",
    )
