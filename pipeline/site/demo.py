"""``python -m pipeline demo``: every built-in handler at work, with nothing outside this machine.

In a folder of its own (``--dir``, default ``./pipeline-demo``: ``demo.db``, ``media/``,
``public/``), so it never touches your database, media or mail, the demo

1. starts two loopback receivers (``demo_sinks.py``): an SMTP sink, and an HTTP sink that
   checks the webhooks' Standard Webhooks signatures;
2. opens the pipeline with the default registry, pointed at them: SMTP_* at the SMTP
   sink, WEBHOOK_URLS at the HTTP sink with a fresh WEBHOOK_SECRET and
   WEBHOOK_ALLOW_PRIVATE_NETWORKS=true (loopback is refused otherwise), the in-memory
   cache (CACHE_URL is ignored), a 100 ms poll and a 0.5 s retry backoff so that a
   failing job settles within the demo; the other settings are yours;
3. seeds users, posts (published ones, a draft, one scheduled 3 seconds ahead) and three
   images made with Pillow (a JPEG whose EXIF says "rotate", a transparent PNG, a GIF);
4. emits UserRegistered, PostCreated, PostScheduled and MediaUploaded, and enqueues a
   send_email and a process_image directly (no event routes to those two);
5. waits until every job of this run has settled (the scheduled post's publication and
   what PostPublished routes to included), then prints a report and exits 0 if no job
   died, 1 otherwise.

Run again, it re-seeds the same rows (the scheduled post is scheduled again) and reports
only the jobs of the new run. Job types without a handler in this build are reported as
skipped, their jobs left pending.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sqlite3
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio

from ..clock import format_ts, now_ts
from ..config import Config
from ..registry import Registry
from ..sqlite_files import write_transaction
from . import content_store, events, jobs
from .content_db import RESOURCE as CONTENT
from .demo_sinks import HttpSink, SmtpSink
from .settings import CacheSettings, MailSettings, SiteSettings, WebhookSettings

SCHEDULE_AHEAD = 3.0  # seconds until the scheduled post is due
SEARCH_WORD = "trio"
SETTLED = ("completed", "dead")

USERS = [("demo-alice", "alice@example.com", "alice"), ("demo-bob", "bob@example.com", "bob"), ("demo-chen", "chen@example.com", "chen")]
# (id, slug, title, body, status): "trio" is in three published posts and the scheduled one
POSTS = [
    ("demo-hello", "hello-trio", "Hello, trio", "Structured concurrency with trio: nurseries, cancel scopes and no lost tasks.", "published"),
    ("demo-queue", "sqlite-job-queue", "SQLite as a job queue", "One file, WAL mode and BEGIN IMMEDIATE: a durable queue for a trio service.", "published"),
    ("demo-fish", "fish-&-chips", "Fish & chips <for> the escaping test", "Titles and slugs with & and < must survive XML and search.", "published"),
    ("demo-images", "thumbnails-and-webp", "Thumbnails and WebP", "Pillow in worker threads, never on the trio loop.", "published"),
    ("demo-draft", "draft-ideas", "Draft: trio ideas", "Not published: neither searchable nor in the sitemap.", "draft"),
    ("demo-launch", "launch-day", "Launch day", "This post was scheduled; scheduled_publish made it live and searchable for trio fans.", "scheduled"),
]
MEDIA = [("demo-photo", "uploads/photo.jpg", "image/jpeg"), ("demo-logo", "uploads/logo.png", "image/png"),
         ("demo-anim", "uploads/anim.gif", "image/gif")]


@attrs.frozen
class Seeded:
    users: int
    posts: Counter[str]
    media: tuple[str, ...]  # media ids with a file
    media_skipped: str | None  # why no images, if so
    publish_at: str
    started: str  # jobs created at or after this belong to this run


def demo_config(base: Config, root: Path, smtp: SmtpSink, http: HttpSink) -> Config:
    return base.replace(
        database_url=f"sqlite:///{root / 'demo.db'}",
        worker=attrs.evolve(base.worker, enabled=True, poll_interval_ms=100, backoff_base_ms=500),
        admin=attrs.evolve(base.admin, enabled=False),
        sections={
            SiteSettings: attrs.evolve(base.section(SiteSettings), database_url="", media_dir=str(root / "media"),
                                       public_dir=str(root / "public")),
            MailSettings: MailSettings(smtp_host=smtp.host, smtp_port=smtp.port, smtp_timeout=10.0,
                                       mail_from="Pipeline demo <demo@example.com>"),
            WebhookSettings: WebhookSettings(urls=(http.url("/hooks/demo"),), secret=http.secret, allow_private_networks=True),
            CacheSettings: CacheSettings(),
        },
    )


# -- seeding ------------------------------------------------------------------------------------


def make_images(media_dir: Path) -> list[tuple[str, str, str, int]]:
    """Write the demo's three images; (id, path, mime type, size). Blocking: run in a thread."""
    from PIL import Image, ImageDraw

    (media_dir / "uploads").mkdir(parents=True, exist_ok=True)
    out = []
    for media_id, rel, mime in MEDIA:
        path = media_dir / rel
        if mime == "image/jpeg":  # stored sideways, EXIF orientation 6 says "rotate 90° clockwise to view"
            img = Image.linear_gradient("L").resize((1200, 800)).convert("RGB")
            ImageDraw.Draw(img).rectangle((100, 100, 500, 300), fill=(200, 60, 40))
            exif = Image.Exif()
            exif[0x0112] = 6
            img.save(path, "JPEG", quality=90, exif=exif)
        elif mime == "image/png":  # transparent background: stays PNG in the thumbnail
            img = Image.new("RGBA", (640, 640), (0, 0, 0, 0))
            ImageDraw.Draw(img).ellipse((40, 40, 600, 600), fill=(30, 120, 200, 255))
            img.save(path, "PNG")
        else:  # two frames: thumbnails take the first
            frames = [Image.new("P", (480, 320), color) for color in (1, 2)]
            frames[0].save(path, "GIF", save_all=True, append_images=frames[1:], duration=200, loop=0)
        out.append((media_id, rel, mime, path.stat().st_size))
    return out


def seed(conn: sqlite3.Connection, publish_at: str, media: Sequence[tuple[str, str, str, int]]) -> None:
    """Upsert the demo rows: a re-run starts them over (the scheduled post scheduled again)."""
    now = now_ts()
    with write_transaction(conn):
        conn.executemany(
            "INSERT INTO users (id, email, username) VALUES (?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET email = excluded.email, username = excluded.username",
            USERS,
        )
        for post_id, slug, title, body, status in POSTS:
            conn.execute(
                "INSERT INTO posts (id, title, body, slug, status, publish_at, published_at, updated_at) "
                "VALUES (:id, :title, :body, :slug, :status, :publish_at, :published_at, :now) "
                "ON CONFLICT (id) DO UPDATE SET title = excluded.title, body = excluded.body, slug = excluded.slug, "
                "status = excluded.status, publish_at = excluded.publish_at, published_at = excluded.published_at, "
                "updated_at = excluded.updated_at",
                {"id": post_id, "title": title, "body": body, "slug": slug, "status": status, "now": now,
                 "publish_at": publish_at if status == "scheduled" else None,
                 "published_at": now if status == "published" else None},
            )
        conn.executemany(
            "INSERT INTO media (id, path, mime_type, size, derived) VALUES (?, ?, ?, ?, '{}') "
            "ON CONFLICT (id) DO UPDATE SET path = excluded.path, mime_type = excluded.mime_type, "
            "size = excluded.size, derived = '{}', updated_at = excluded.updated_at",
            media,
        )


# -- reading the results --------------------------------------------------------------------------


async def jobs_of_run(p: Any, started: str) -> list[tuple[str, str, str | None]]:
    """(job_type, status, error) of every job created since ``started``, oldest first."""
    records, _ = await p.backend.list(limit=10_000)
    return [(r.job_type, r.status, r.error) for r in reversed(records) if r.created_at >= started]


def post_state(conn: sqlite3.Connection, post_id: str) -> tuple[str, str | None] | None:
    return conn.execute("SELECT status, published_at FROM posts WHERE id = ?", (post_id,)).fetchone()


def derived_files(conn: sqlite3.Connection) -> list[tuple[str, dict[str, str]]]:
    ids = [m[0] for m in MEDIA]
    rows = conn.execute("SELECT id, derived FROM media WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id", (json.dumps(ids),))
    return [(media_id, json.loads(derived)) for media_id, derived in rows]


async def wait_settled(p: Any, started: str, handled: set[str], timeout: float) -> bool:
    """Until no job of this run that this build can run is pending or running; False on timeout."""
    with trio.move_on_after(timeout):
        while True:
            rows = await jobs_of_run(p, started)
            if not any(status not in SETTLED and job_type in handled for job_type, status, _ in rows):
                return True
            await trio.sleep(0.1)
    return False


# -- the run ------------------------------------------------------------------------------------


async def run(config: Config, root: Path, registry: Registry | None, timeout: float, schedule_ahead: float, out: TextIO) -> int:
    from ..engine.wiring import open_pipeline
    from . import default_registry

    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    smtp, http = SmtpSink(), HttpSink(secret)
    async with trio.open_nursery() as tn:
        await tn.start(smtp.run)
        await tn.start(http.run)
        config = demo_config(config, root, smtp, http)
        registry = registry or default_registry(config)
        handled = set(registry.handled())
        (root / "media").mkdir(parents=True, exist_ok=True)
        print(f"pipeline demo in {root}/ (demo.db, media/, public/)", file=out)
        print(f"  SMTP sink  {smtp.host}:{smtp.port}    HTTP sink  {http.url('/hooks/demo')} (checks signatures)", file=out)
        began = time.monotonic()
        async with open_pipeline(config, registry) as p:
            seeded = await _seed(p, config, schedule_ahead)
            await _emit(p, seeded, out)
            print(f"waiting for the jobs (up to {timeout:g} s) ...", file=out, flush=True)
            finished = await wait_settled(p, seeded.started, handled, timeout)
            report = await _gather(p, seeded)
        code = _print_report(out, report, seeded, smtp, http, handled, finished, time.monotonic() - began, config)
        tn.cancel_scope.cancel()
    return code


async def _seed(p: Any, config: Config, schedule_ahead: float) -> Seeded:
    started = now_ts()
    publish_at = format_ts(time.time() + schedule_ahead)
    media: list[tuple[str, str, str, int]] = []
    skipped = None
    try:
        media = await trio.to_thread.run_sync(make_images, Path(config.section(SiteSettings).media_dir))
    except ImportError as exc:
        skipped = f"Pillow is not installed ({exc}); pip install pillow"
    await p.resources[CONTENT].run(seed, publish_at, media)
    return Seeded(len(USERS), Counter(post[4] for post in POSTS), tuple(m[0] for m in media), skipped, publish_at, started)


async def _emit(p: Any, seeded: Seeded, out: TextIO) -> None:
    emitted: Counter[str] = Counter()
    ids: list[str] = []

    async def emit(event: Any) -> None:
        ids.extend(await p.emit(event))
        emitted[type(event).__name__] += 1

    for user_id, email, username in USERS:
        await emit(events.UserRegistered(user_id=user_id, email=email, username=username))
    for post in POSTS:
        await emit(events.PostCreated(id=post[0]))
    await emit(events.PostScheduled(id="demo-launch", publish_at=seeded.publish_at))
    for media_id in seeded.media:
        await emit(events.MediaUploaded(id=media_id))
    direct: list[Any] = [jobs.SendEmail(to="editor@example.com", subject="Demo: launch-day is scheduled",
                             body=f"The post launch-day goes live at {seeded.publish_at}.\n")]
    if "demo-photo" in seeded.media:
        direct.append(jobs.ProcessImage(media_id="demo-photo", operations=(jobs.Resize(width=800, height=800), jobs.Compress(quality=70))))
    ids.extend(await p.enqueue_many(direct))
    posts = ", ".join(f"{n} {status}" for status, n in sorted(seeded.posts.items()))
    print(f"seeded {seeded.users} users, {sum(seeded.posts.values())} posts ({posts}; the scheduled one due at "
          f"{seeded.publish_at}), {len(seeded.media)} images" + (f" (images skipped: {seeded.media_skipped})" if seeded.media_skipped else ""), file=out)
    print("emitted " + ", ".join(f"{n} {name}" for name, n in emitted.items())
          + f"; enqueued {', '.join(p.registry.name_of(j) for j in direct)} directly: {len(ids)} jobs", file=out)


@attrs.frozen
class Report:
    jobs: list[tuple[str, str, str | None]]
    launch: tuple[str, str | None] | None
    derived: list[tuple[str, dict[str, str]]]
    hits: list[content_store.SearchHit]


async def _gather(p: Any, seeded: Seeded) -> Report:
    def content(conn: sqlite3.Connection) -> tuple[Any, ...]:
        return post_state(conn, "demo-launch"), derived_files(conn), content_store.search(conn, SEARCH_WORD, limit=10)

    return Report(await jobs_of_run(p, seeded.started), *await p.resources[CONTENT].run(content))


def _print_report(out: TextIO, r: Report, seeded: Seeded, smtp: SmtpSink, http: HttpSink, handled: set[str],
                  finished: bool, took: float, config: Config) -> int:
    def say(text: str = "") -> None:
        print(text, file=out)

    say(f"done in {took:.1f} s" if finished else f"gave up waiting after {took:.1f} s: some jobs are still pending")
    counts: dict[str, Counter[str]] = {}
    for job_type, status, _ in r.jobs:
        counts.setdefault(job_type, Counter())[status] += 1
    say("\njobs by type")
    columns = ("completed", "dead", "pending", "running")
    say(f"  {'TYPE':<22}" + "".join(f"{c.upper():>11}" for c in columns))
    for job_type in sorted(counts):
        say(f"  {job_type:<22}" + "".join(f"{counts[job_type][c]:>11}" for c in columns))
    total = Counter(status for _, status, _ in r.jobs)
    say(f"  {'total':<22}" + "".join(f"{total[c]:>11}" for c in columns))
    for job_type in sorted(set(counts) - handled):
        say(f"  skipped: {job_type} has no handler in this build; its jobs stay pending")
    dead = [(t, e) for t, s, e in r.jobs if s == "dead"]
    for job_type, error in dead:
        say(f"  dead: {job_type}: {(error or '').splitlines()[0] if error else ''}")

    say("\nfiles made")
    site = config.section(SiteSettings)
    media_dir, public_dir = Path(site.media_dir), Path(site.public_dir)
    files = [(f"media/{rel}", _describe_image(media_dir / rel)) for _, derived in r.derived for rel in sorted(derived.values())]
    sitemap_urls = _sitemap_urls(public_dir / "sitemap.xml")
    if sitemap_urls is not None:
        parts = sorted(public_dir.glob("sitemap*.xml"))
        files += [(f"public/{part.name}", f"{part.stat().st_size:,} bytes") for part in parts]
    width = max((len(name) for name, _ in files), default=0)
    for name, what in files:
        say(f"  {name:<{width}}  {what}")
    if seeded.media_skipped:
        say(f"  images skipped: {seeded.media_skipped}")
    if sitemap_urls is None:
        say("  public/sitemap.xml was not written")

    if r.launch is not None:
        status, published_at = r.launch
        say(f"\nscheduled post demo-launch: {status}" + (f" at {published_at} (due {seeded.publish_at})" if published_at else ""))

    say(f"\nsearch {SEARCH_WORD!r}: {len(r.hits)} hit{'s' if len(r.hits) != 1 else ''} "
        "(published posts only: the draft demo-draft says trio too)")
    for hit in r.hits:
        say(f"  {hit.id:<12} {hit.title}")
        say(f"  {'':<12} {' '.join(hit.snippet.split())}")

    say(f"\nsitemap entries: {len(sitemap_urls or [])} (on disk the & is written &amp;)")
    for loc, lastmod in sitemap_urls or []:
        say(f"  {loc}  {lastmod or ''}")

    say(f"\nmail received by the SMTP sink: {len(smtp.received)}")
    for mail in smtp.received:
        say(f"  to {', '.join(mail.rcpt_tos)}: {mail.message['subject']!s}  [{' + '.join(mail.content_types)}]")

    valid = sum(1 for req in http.received if req.signature_ok)
    say(f"\nwebhook requests received by the HTTP sink: {len(http.received)} (signature valid: {valid})")
    for req in http.received:
        try:
            body = req.json()
            what = f"{body.get('event')} {body.get('data', {}).get('id', '')}"
        except (ValueError, AttributeError):
            what = f"{len(req.body)} bytes"
        say(f"  {req.method} {req.target}  {what}  webhook-id {req.headers.get('webhook-id', '-')}")

    if counts.get("invalidate_cache"):
        say(f"\ncache: {counts['invalidate_cache']['completed']} invalidate_cache jobs ran on the in-memory store (the demo ignores CACHE_URL)")

    db = config.database_url
    say("\nlook around:")
    say(f"  DATABASE_URL={db} python -m pipeline jobs")
    say(f"  DATABASE_URL={db} python -m pipeline search '{SEARCH_WORD} OR pillow'")
    return 0 if finished and not dead else 1


def _describe_image(path: Path) -> str:
    try:
        size = path.stat().st_size
    except OSError:
        return "missing"
    try:
        from PIL import Image

        with Image.open(path) as img:
            return f"{img.format} {img.width}x{img.height}, {size:,} bytes"
    except Exception:  # noqa: BLE001 - a description only
        return f"{size:,} bytes"


def _sitemap_urls(path: Path) -> list[tuple[str, str | None]] | None:
    """(loc, lastmod) of every URL, following a sitemap index to its parts."""
    if not path.exists():
        return None
    ns = {"sm": "http://www.sitemaps.org/schemas/sitemap/0.9"}
    root = ET.parse(path).getroot()
    if root.tag.endswith("sitemapindex"):
        urls: list[tuple[str, str | None]] = []
        for loc in root.iterfind("sm:sitemap/sm:loc", ns):
            urls.extend(_sitemap_urls(path.parent / (loc.text or "").rsplit("/", 1)[-1]) or [])
        return urls
    return [(u.findtext("sm:loc", "", ns), u.findtext("sm:lastmod", None, ns)) for u in root.iterfind("sm:url", ns)]


def run_demo(config: Config, root: Path, *, registry: Registry | None = None, timeout: float = 60.0,
             verbose: bool = False, schedule_ahead: float = SCHEDULE_AHEAD, out: TextIO) -> int:
    """The ``demo`` command. Exit status 0 when no job of the run died and none was left running, 1 otherwise."""
    from ..errors import UsageError

    if not timeout > 0:
        raise UsageError(f"--timeout must be a number of seconds > 0, got {timeout}")
    from . import require_demo

    require_demo("the demo command")  # its seed draws images with Pillow, whatever the registry
    if verbose:
        from ..logs import configure

        configure(config)
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not os.access(root, os.W_OK):
        raise UsageError(f"--dir {root} is not writable; pick another folder for the demo")
    return trio.run(run, config, root, registry, timeout, schedule_ahead, out)
