"""The content handlers: publishing, search and sitemap, over migration 2's tables.

    scheduled_publish      publishes a scheduled post when due, emits PostPublished   (publish.py)
    rebuild_search_index   refreshes the FTS5 rows of the given posts                  (search.py)
    generate_sitemap       writes PUBLIC_DIR/sitemap.xml of the published posts        (sitemap.py)

Their SQL is in ``content_store.py``. They run it in the database's threads
(the ``"content"`` resource, content_db.py); the sitemap's file writing runs in a thread of its own resource.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from ..config import Config
from .content_db import RESOURCE as CONTENT
from .content_db import ContentDatabase, open_content_database
from .jobs import GenerateSitemap, RebuildSearchIndex, ScheduledPublish
from .publish import scheduled_publish
from .search import rebuild_search_index
from .sitemap import RESOURCE as SITEMAP_RESOURCE
from .sitemap import SITEMAP_LIMIT, generate_sitemap, open_sitemap_writer

if TYPE_CHECKING:
    from ..registry import Registry


def install(registry: Registry, config: Config, *, sitemap_limit: int = SITEMAP_LIMIT) -> None:
    """Attach the three content handlers and the ``"sitemap"`` resource.

    ``sitemap_limit``: URLs per sitemap file before it is split (sitemaps.org: 50,000).
    """
    if sitemap_limit < 1:
        raise ValueError(f"sitemap_limit must be >= 1, got {sitemap_limit}")

    def factory(config: Config, registry: Registry) -> Any:
        return open_sitemap_writer(sitemap_limit)

    registry.add_resource(SITEMAP_RESOURCE, factory)
    registry.add_resource(CONTENT, _open_content)
    registry.register("scheduled_publish", ScheduledPublish, scheduled_publish)
    registry.register("rebuild_search_index", RebuildSearchIndex, rebuild_search_index)
    # one at a time: two runs writing the same files could interleave their parts
    registry.register("generate_sitemap", GenerateSitemap, generate_sitemap, concurrency=1)


def _open_content(config: Config, registry: Registry) -> AbstractAsyncContextManager[ContentDatabase]:
    return open_content_database(config)
