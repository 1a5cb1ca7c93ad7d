"""Image handlers: ``generate_thumbnail``, ``convert_webp`` and ``process_image`` (seed 7), with Pillow.

Each job reads one row of the ``media`` table, decodes the file it names under
MEDIA_DIR, writes one derived file under ``MEDIA_DIR/derived/<media id>/`` and records
that file's path (relative to MEDIA_DIR) in the row's ``derived`` JSON object:

=======================  =================================  ==========================
job                      derived key                        file
=======================  =================================  ==========================
generate_thumbnail       ``thumbnail_<size>``               ``thumb_<size>.jpg|png``
convert_webp             ``webp``                           ``<source stem>.webp``
process_image            ``processed_<hash of operations>``  ``processed_<hash>.jpg|png``
=======================  =================================  ==========================

Choices, for a reader who would have chosen otherwise:

* **Orientation**: EXIF orientation is applied first (``ImageOps.exif_transpose``), so
  every output is upright and sizes below are of the upright image.
* **Thumbnail**: the longest side becomes ``size``, aspect ratio kept; never enlarged:
  an image already smaller is re-encoded at its own size (a thumbnail is for showing
  small, and an enlarged one only costs bytes).
* **Resize{width, height}**: fits the image *within* width × height, aspect ratio kept,
  enlarging when it is smaller, as the seed's ``image`` crate ``DynamicImage::resize``
  does. Operations run in the order given. A result over IMAGE_MAX_PIXELS is refused.
* **Compress{quality}**: the quality of the final save (the last one wins); compressing
  mid-way and decoding again would only add artefacts.
* **Output format**: opaque images become JPEG (quality 85 unless Compress says
  otherwise); images with real transparency stay PNG (lossless: Compress's quality has
  no meaning there). convert_webp always writes WebP (lossy, quality 80, alpha kept).
* **Metadata**: outputs carry no EXIF (no camera GPS on public thumbnails); the ICC
  colour profile of an RGB source is kept.
* **Animation**: GIF, WebP and APNG animations are reduced to their first frame.

Refused at once (``PermanentError``, the message says which): an unknown media id; a
path that is absolute or resolves outside MEDIA_DIR (``..``, a symlink pointing out);
a missing file or one that is not a regular file; a file Pillow cannot decode or that is
not one of :data:`FORMATS` (a text file named ``.jpg``); an image over IMAGE_MAX_PIXELS
(checked from the header before any pixel is decoded; Pillow's own decompression-bomb
error, at twice its ~89-megapixel default, is caught too). Other failures (disk full
while writing, the database busy) are retried with backoff.

Files are written atomically: a temporary file in the destination directory, fsync, then
``os.replace``, so a reader sees the old file or the new one, never half of one. The
same job run twice writes the same name with the same bytes and leaves the row as it was.

Pillow runs in threads behind the ``"images"`` resource's own CapacityLimiter (one per
CPU: Pillow releases the GIL while decoding, resizing and encoding), never on the trio
loop and never in the database's threads. Memory: each running image holds its decoded
pixels, up to about 4 bytes × IMAGE_MAX_PIXELS.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sqlite3
import stat
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import attrs
import trio
from PIL import Image, ImageOps

from ..clock import now_ts
from ..config import Config
from ..errors import PermanentError
from ..sqlite_files import write_transaction
from .content_db import RESOURCE as CONTENT
from .content_db import ContentDatabase, open_content_database
from .jobs import Compress, ConvertWebP, GenerateThumbnail, ImageOperation, ProcessImage, Resize
from .settings import ImageSettings, SiteSettings

if TYPE_CHECKING:
    from ..context import JobContext
    from ..registry import Registry

RESOURCE = "images"

# What Image.open may try. A closed list, because some of Pillow's other plugins hand the
# file to outside programs (EPS runs Ghostscript). The JPEG plugin also opens the MPO files
# many phone cameras write (img.format is then "MPO").
FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF")
JPEG_QUALITY = 85
WEBP_QUALITY = 80
DERIVED_DIR = "derived"

# What Pillow raises on a file it cannot decode: the file is bad, trying again will not help.
# (MemoryError is left out on purpose: it may pass, so it is retried like any other error.)
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError, TypeError)
_SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


@attrs.frozen
class ImageWorker:
    """The ``"images"`` resource: where media live, the pixel limit, the thread limiter."""

    media_dir: Path  # MEDIA_DIR as configured; resolved per job, so it may appear after start-up
    max_pixels: int  # IMAGE_MAX_PIXELS
    limiter: trio.CapacityLimiter  # Pillow threads only, shared by the three job types


@asynccontextmanager
async def open_image_worker(config: Config, *, threads: int | None = None) -> AsyncIterator[ImageWorker]:
    media_dir, max_pixels = config.section(SiteSettings).media_dir, config.section(ImageSettings).max_pixels
    yield ImageWorker(Path(media_dir), max_pixels, trio.CapacityLimiter(threads or os.cpu_count() or 1))


# -- the media row ------------------------------------------------------------------------

SELECT_MEDIA = "SELECT id, path, derived FROM media WHERE id = ?"
UPDATE_MEDIA_DERIVED = "UPDATE media SET derived = ?, updated_at = ? WHERE id = ?"


@attrs.frozen
class Media:
    id: str
    path: str  # relative to MEDIA_DIR
    derived: dict[str, str]


def _parse_derived(media_id: str, text: str | None) -> dict[str, str]:
    if text is None or text.strip() == "":
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise PermanentError(f"media {media_id!r}: its derived column is not a JSON object ({text[:80]!r}); fix the row")
    return value


def load_media(conn: sqlite3.Connection, media_id: str) -> Media | None:
    row = conn.execute(SELECT_MEDIA, (media_id,)).fetchone()
    if row is None:
        return None
    return Media(row[0], row[1], _parse_derived(row[0], row[2]))


def record_derived(conn: sqlite3.Connection, media_id: str, key: str, rel_path: str) -> bool | None:
    """Set ``derived[key] = rel_path`` on the row. None: no such row; False: it was already so."""
    with write_transaction(conn):
        row = conn.execute(SELECT_MEDIA, (media_id,)).fetchone()
        if row is None:
            return None
        derived = _parse_derived(media_id, row[2])
        if derived.get(key) == rel_path:
            return False  # a re-run: same row, updated_at untouched
        derived[key] = rel_path
        conn.execute(UPDATE_MEDIA_DERIVED, (json.dumps(derived, sort_keys=True), now_ts(), media_id))
        return True


# -- recipes: what each job does to the decoded image ---------------------------------------


Between = Callable[[], None]  # called between steps in the image thread: raises trio.Cancelled once the job is


def _never() -> None:
    """``between`` outside a trio thread: nothing can cancel the work."""


@attrs.frozen
class Recipe:
    key: str  # the entry in the row's derived object
    stem: str  # file name without extension, in derived/<media id>/
    # (upright image, IMAGE_MAX_PIXELS, between) -> output image; ``between`` goes between operations
    transform: Callable[[Image.Image, int, Between], Image.Image]
    format: str | None = None  # None: JPEG when opaque, PNG when transparent
    quality: int = JPEG_QUALITY
    draft_size: int | None = None  # JPEG only: let the decoder scale down by up to 8x first


def thumbnail_recipe(size: int) -> Recipe:
    def transform(img: Image.Image, max_pixels: int, between: Between) -> Image.Image:
        img.thumbnail((size, size), Image.Resampling.LANCZOS)  # keeps aspect, never enlarges
        return img

    return Recipe(f"thumbnail_{size}", f"thumb_{size}", transform, draft_size=size)


def webp_recipe(source_path: str) -> Recipe:
    # the upload's own name, made safe and short enough for any filesystem's name limit
    stem = re.sub(r"[^\w.-]", "_", PurePosixPath(source_path).stem).lstrip(".")[:100] or "image"
    return Recipe("webp", stem, lambda img, _max, _between: img, format="WEBP", quality=WEBP_QUALITY)


def operations_hash(operations: Sequence[ImageOperation]) -> str:
    """A short stable name for a list of operations: same list, same file."""
    canonical = json.dumps([{type(op).__name__: attrs.asdict(op)} for op in operations], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def fit_within(size: tuple[int, int], box: tuple[int, int]) -> tuple[int, int]:
    """The largest size with ``size``'s aspect ratio that fits in ``box`` (may enlarge)."""
    (w, h), (bw, bh) = size, box
    scale = min(bw / w, bh / h)
    return max(1, min(bw, round(w * scale))), max(1, min(bh, round(h * scale)))


def process_recipe(media_id: str, operations: Sequence[ImageOperation]) -> Recipe:
    quality = JPEG_QUALITY
    for op in operations:
        if isinstance(op, Compress):
            quality = op.quality

    def transform(img: Image.Image, max_pixels: int, between: Between) -> Image.Image:
        for op in operations:
            between()  # the job's timeout (or a graceful stop) takes effect here, not after every operation
            if isinstance(op, Resize):
                target = fit_within(img.size, (op.width, op.height))
                if target[0] * target[1] > max_pixels:
                    raise PermanentError(
                        f"media {media_id!r}: Resize to {op.width}x{op.height} would make a {target[0]}x{target[1]} image, "
                        f"over IMAGE_MAX_PIXELS={max_pixels}"
                    )
                if target != img.size:
                    img = img.resize(target, Image.Resampling.LANCZOS)
        return img

    name = f"processed_{operations_hash(operations)}"
    return Recipe(name, name, transform, quality=quality)


# -- files: resolve, decode, write (all blocking; run in the image threads) ----------------------


def _inside(root_real: str, path_real: str) -> bool:
    return os.path.commonpath([root_real, path_real]) == root_real


def _media_root(worker: ImageWorker, media_id: str) -> str:
    root_real = os.path.realpath(worker.media_dir)
    if not os.path.isdir(root_real):
        raise PermanentError(f"media {media_id!r}: MEDIA_DIR {str(worker.media_dir)!r} is not a directory; set MEDIA_DIR")
    return root_real


def resolve_source(root_real: str, media: Media) -> str:
    """The real path of the media file; PermanentError if it is outside MEDIA_DIR or not a file."""
    rel = media.path
    if not rel or "\x00" in rel:
        raise PermanentError(f"media {media.id!r}: path {rel!r} is empty or invalid")
    if os.path.isabs(rel):
        raise PermanentError(f"media {media.id!r}: path {rel!r} is absolute; media paths are relative to MEDIA_DIR ({root_real})")
    real = os.path.realpath(os.path.join(root_real, rel))  # follows every symlink and '..'
    if not _inside(root_real, real):
        raise PermanentError(f"media {media.id!r}: path {rel!r} resolves to {real}, outside MEDIA_DIR ({root_real}); refusing to read it")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise PermanentError(f"media {media.id!r}: file {rel!r} is missing (no {real})") from None
    except OSError as exc:  # permission denied, a symlink loop
        raise PermanentError(f"media {media.id!r}: file {rel!r} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PermanentError(f"media {media.id!r}: {rel!r} is not a regular file")
    return real


def decode(real: str, media: Media, max_pixels: int, draft_size: int | None) -> tuple[Image.Image, bytes | None]:
    """Open, check the pixel count from the header, decode, apply EXIF orientation.

    Returns the upright image and the ICC profile worth keeping (an RGB source's; a CMYK
    or grey profile would be wrong on the RGB output).
    """
    # O_NOFOLLOW: the file checked above cannot be swapped for a symlink out of MEDIA_DIR;
    # O_NONBLOCK: nor for a FIFO that would hang this thread
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise PermanentError(f"media {media.id!r}: file {media.path!r} cannot be opened: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fp:
        try:
            img = Image.open(fp, formats=FORMATS)  # lazy: reads the header only
        except Image.UnidentifiedImageError:
            raise PermanentError(
                f"media {media.id!r}: {media.path!r} is not an image this pipeline reads (supported: {', '.join(FORMATS)})"
            ) from None
        except Image.DecompressionBombError as exc:
            raise PermanentError(f"media {media.id!r}: {media.path!r} is a decompression bomb, over Pillow's own limit: {exc}") from None
        except _DECODE_ERRORS as exc:
            raise PermanentError(f"media {media.id!r}: {media.path!r} cannot be read as an image: {exc}") from None
        with img:
            width, height = img.size
            if width * height > max_pixels:
                raise PermanentError(
                    f"media {media.id!r}: {media.path!r} is {width}x{height} = {width * height} pixels, "
                    f"over IMAGE_MAX_PIXELS={max_pixels} (decompression-bomb limit); not decoded"
                )
            try:
                if draft_size is not None and img.format in ("JPEG", "MPO"):
                    img.draft(None, (draft_size, draft_size))  # decode at 1/2..1/8 scale, still >= draft_size
                img.load()
                upright = ImageOps.exif_transpose(img)  # a new, loaded image, upright, orientation tag removed
            except Image.DecompressionBombError as exc:
                raise PermanentError(f"media {media.id!r}: {media.path!r} is a decompression bomb, over Pillow's own limit: {exc}") from None
            except _DECODE_ERRORS as exc:
                raise PermanentError(f"media {media.id!r}: {media.path!r} is damaged or cannot be decoded: {exc}") from None
            icc = img.info.get("icc_profile") if img.mode in ("RGB", "RGBA") else None
            return upright, icc


def normalise(img: Image.Image) -> Image.Image:
    """RGB, or RGBA when the image really has transparent pixels (an opaque alpha channel is dropped)."""
    if img.has_transparency_data:
        rgba = img.convert("RGBA")
        lowest, _ = rgba.getchannel("A").getextrema()  # one band: (min, max)
        if isinstance(lowest, (int, float)) and lowest < 255:
            return rgba
        return rgba.convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def encode_options(img: Image.Image, recipe: Recipe, icc_profile: bytes | None) -> tuple[str, str, dict[str, Any]]:
    """(Pillow format, file extension, save options) for this output."""
    fmt = recipe.format or ("PNG" if img.mode == "RGBA" else "JPEG")
    options: dict[str, Any] = {}
    if icc_profile:
        options["icc_profile"] = icc_profile
    if fmt == "JPEG":
        return fmt, "jpg", {**options, "quality": recipe.quality, "optimize": True}
    if fmt == "PNG":
        return fmt, "png", {**options, "optimize": True}
    return fmt, "webp", {**options, "quality": recipe.quality, "method": 4}


def derived_dir_name(media_id: str) -> str:
    """The media id when it is a safe file name, else a hash of it (ids come from payloads)."""
    if _SAFE_ID.fullmatch(media_id):
        return media_id
    return "id-" + hashlib.sha256(media_id.encode()).hexdigest()[:24]


def _check_writable(root_real: str, directory: str, media_id: str) -> None:
    real = os.path.realpath(directory)
    if not _inside(root_real, real):  # e.g. derived/ is a symlink pointing out
        raise PermanentError(
            f"media {media_id!r}: output folder {directory} resolves to {real}, outside MEDIA_DIR ({root_real}); refusing to write there"
        )


def write_atomically(root_real: str, rel: PurePosixPath, img: Image.Image, fmt: str, options: dict[str, Any], media_id: str) -> None:
    """Write ``MEDIA_DIR/rel``: temporary file in the same directory, fsync, os.replace."""
    directory = os.path.join(root_real, *rel.parent.parts)
    _check_writable(root_real, os.path.join(root_real, rel.parts[0]), media_id)  # before makedirs creates anything
    _check_writable(root_real, directory, media_id)
    os.makedirs(directory, exist_ok=True)
    _check_writable(root_real, directory, media_id)
    final = os.path.join(directory, rel.name)
    tmp = os.path.join(directory, f".{rel.name}.{secrets.token_hex(6)}.tmp")
    # O_EXCL | O_NOFOLLOW: never write through a planted file or symlink; mode 0o666 less the
    # umask, as for any file the process creates (mkstemp's 0o600 would hide it from a web server)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as fp:
            img.save(fp, format=fmt, **options)
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, final)  # rename(2): replaces a symlink at `final` itself, never its target
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with suppress(OSError):  # make the rename itself durable; not every filesystem allows it
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def render(worker: ImageWorker, media: Media, recipe: Recipe, between: Between = _never) -> str:
    """Make one derived file; return its path relative to MEDIA_DIR. Blocking: run in a thread.

    ``between`` is called between the steps (decode, each operation, encode and write);
    from a trio thread, ``trio.from_thread.check_cancelled`` stops the work there once the
    job is cancelled. One step is never interrupted: its size is what the bounds limit."""
    root_real = _media_root(worker, media.id)
    source = resolve_source(root_real, media)
    img, icc = decode(source, media, worker.max_pixels, recipe.draft_size)
    between()
    out = recipe.transform(normalise(img), worker.max_pixels, between)
    between()
    fmt, ext, options = encode_options(out, recipe, icc)
    rel = PurePosixPath(DERIVED_DIR, derived_dir_name(media.id), f"{recipe.stem}.{ext}")
    write_atomically(root_real, rel, out, fmt, options, media.id)
    return rel.as_posix()


# -- handlers -------------------------------------------------------------------------------------


async def _make(ctx: JobContext, media_id: str, recipe_for: Callable[[Media], Recipe]) -> None:
    worker: ImageWorker = ctx.resources[RESOURCE]
    db: ContentDatabase = ctx.resources[CONTENT]
    media = await db.run(load_media, media_id)
    if media is None:
        raise PermanentError(f"media {media_id!r} not found in the media table")
    recipe = recipe_for(media)
    # Not abandon_on_cancel: a thread left behind could still be writing after the job was
    # released. Instead the thread checks between steps whether the job was cancelled (its
    # timeout, a graceful stop), so it stops within one step; a step is bounded by
    # IMAGE_MAX_PIXELS and the job's by MAX_OPERATIONS.
    rel = await trio.to_thread.run_sync(render, worker, media, recipe, trio.from_thread.check_cancelled, limiter=worker.limiter)
    if await db.run(record_derived, media.id, recipe.key, rel) is None:
        raise PermanentError(f"media {media_id!r} was deleted while {recipe.key} was being made; {rel} is left on disk")


async def generate_thumbnail(job: GenerateThumbnail, ctx: JobContext) -> None:
    await _make(ctx, job.media_id, lambda media: thumbnail_recipe(job.size))


async def convert_webp(job: ConvertWebP, ctx: JobContext) -> None:
    await _make(ctx, job.media_id, lambda media: webp_recipe(media.path))


async def process_image(job: ProcessImage, ctx: JobContext) -> None:
    await _make(ctx, job.media_id, lambda media: process_recipe(media.id, job.operations))


def install(registry: Registry, config: Config, *, threads: int | None = None) -> None:
    """Attach the three image handlers and the ``"images"`` resource.

    ``threads``: how many images are decoded and encoded at once, across the three job
    types (default: one per CPU). Each holds up to ~4 bytes x IMAGE_MAX_PIXELS of memory.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"image threads must be >= 1, got {threads!r}")

    def factory(config: Config, registry: Registry) -> Any:
        return open_image_worker(config, threads=threads)

    registry.add_resource(RESOURCE, factory)
    registry.add_resource(CONTENT, _open_content)
    registry.register("generate_thumbnail", GenerateThumbnail, generate_thumbnail)
    registry.register("convert_webp", ConvertWebP, convert_webp)
    registry.register("process_image", ProcessImage, process_image)


def _open_content(config: Config, registry: Registry) -> AbstractAsyncContextManager[ContentDatabase]:
    return open_content_database(config)
