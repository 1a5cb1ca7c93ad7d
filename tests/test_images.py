"""The image handlers end to end: real image files made with Pillow, a running pipeline, outputs opened again."""

from __future__ import annotations

import json
import sqlite3
import struct
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import fast_config
from PIL import Image

import pipeline
from pipeline import cli
from pipeline.backends import JobRecord
from pipeline.site import Compress, ConvertWebP, GenerateThumbnail, MediaUploaded, ProcessImage, Resize, default_registry, images
from pipeline.site.images import derived_dir_name, fit_within, operations_hash
from pipeline.site.settings import SiteSettings
from pipeline.sqlite_files import write_transaction

RED, BLUE, GREEN = (220, 20, 20), (20, 20, 220), (20, 200, 20)
ORIENTATION = 0x0112


# -- image files ----------------------------------------------------------------------------------


def make_rotated_jpeg(path: Path) -> None:
    """400x200 as stored, red left half, blue right; EXIF orientation 6 (turn 90° clockwise to view).

    Upright it is 200x400: red on top, blue below.
    """
    img = Image.new("RGB", (400, 200), BLUE)
    img.paste(RED, (0, 0, 200, 200))
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    img.save(path, "JPEG", quality=95, exif=exif)


def make_alpha_png(path: Path) -> None:
    """300x200: left half opaque green, right half fully transparent."""
    img = Image.new("RGBA", (300, 200), (0, 0, 0, 0))
    img.paste((*GREEN, 255), (0, 0, 150, 200))
    img.save(path, "PNG")


def make_gif(path: Path, *, transparent: bool = False) -> None:
    """120x80 palette image; with ``transparent`` the right half is the transparent colour."""
    img = Image.new("P", (120, 80), 1)
    img.putpalette([*RED, *BLUE] + [0] * (256 * 3 - 6))
    if transparent:
        img.paste(0, (60, 0, 120, 80))
        img.save(path, "GIF", transparency=0)
    else:
        img.save(path, "GIF")


def png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims width x height (a decompression bomb's calling card)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def opened(path: Path) -> Image.Image:
    img = Image.open(path)
    img.load()
    return img


# -- a running pipeline with a media table ---------------------------------------------------------


class Images:
    """A running pipeline, its MEDIA_DIR, and a way to run a job to its end."""

    def __init__(self, p: pipeline.Pipeline, media: Path) -> None:
        self.p = p
        self.media = media
        self.settled: set[str] = set()
        self._changed = trio.Event()
        p.add_observer(self._observe)

    def _observe(self, fields: dict[str, Any]) -> None:
        if fields["status"] in ("completed", "dead"):
            self.settled.add(fields["job_id"])
            self._changed.set()

    async def wait(self, job_ids: list[str]) -> list[JobRecord]:
        with trio.fail_after(20):
            while not self.settled.issuperset(job_ids):
                self._changed = trio.Event()
                await self._changed.wait()
        records = [await self.p.backend.get(job_id) for job_id in job_ids]
        return [r for r in records if r is not None]

    async def run(self, *jobs: Any) -> list[JobRecord]:
        return await self.wait([await self.p.enqueue(job) for job in jobs])

    async def run_one(self, job: Any) -> JobRecord:
        (record,) = await self.run(job)
        return record

    async def add_media(self, media_id: str, path: str, mime_type: str = "image/jpeg") -> None:
        full = self.media / path
        size = full.stat().st_size if full.is_file() else 0

        def insert(conn: sqlite3.Connection) -> None:
            with write_transaction(conn):
                conn.execute("INSERT INTO media (id, path, mime_type, size) VALUES (?, ?, ?, ?)", (media_id, path, mime_type, size))

        await self.p.resources["content"].run(insert)

    async def row(self, media_id: str) -> tuple[dict[str, str], str]:
        def select(conn: sqlite3.Connection) -> tuple[str, str]:
            return conn.execute("SELECT derived, updated_at FROM media WHERE id = ?", (media_id,)).fetchone()

        derived, updated_at = await self.p.resources["content"].run(select)
        return json.loads(derived or "{}"), updated_at


@asynccontextmanager
async def running_images(config: pipeline.Config) -> AsyncIterator[Images]:
    async with pipeline.open_pipeline(config, default_registry(config)) as p:  # migration 2 made the media table
        yield Images(p, Path(config.section(SiteSettings).media_dir))


@pytest.fixture
def media(tmp_path: Path) -> Path:
    path = tmp_path / "media"
    path.mkdir()
    return path


@pytest.fixture
def image_config(db_path: Path, media: Path) -> pipeline.Config:
    return fast_config(db_path, media_dir=str(media))


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


# -- what the handlers make ----------------------------------------------------------------------


async def test_thumbnail_of_a_rotated_jpeg_is_upright_and_fits_the_size(image_config: pipeline.Config, media: Path) -> None:
    make_rotated_jpeg(media / "photo.jpg")
    async with running_images(image_config) as im:
        await im.add_media("m1", "photo.jpg")
        record = await im.run_one(GenerateThumbnail("m1", 100))
        assert (record.status, record.error) == ("completed", None)
        derived, _ = await im.row("m1")

    assert derived == {"thumbnail_100": "derived/m1/thumb_100.jpg"}
    thumb = opened(media / derived["thumbnail_100"])
    assert thumb.format == "JPEG" and thumb.mode == "RGB"
    assert thumb.size == (50, 100)  # upright 200x400, longest side 100
    assert _close(thumb.getpixel((25, 10)), RED) and _close(thumb.getpixel((25, 90)), BLUE)
    assert ORIENTATION not in thumb.getexif()  # no EXIF carried over at all


async def test_thumbnail_of_a_transparent_png_stays_png_with_alpha(image_config: pipeline.Config, media: Path) -> None:
    make_alpha_png(media / "logo.png")
    async with running_images(image_config) as im:
        await im.add_media("logo", "logo.png", "image/png")
        record = await im.run_one(GenerateThumbnail("logo", 150))
        assert record.status == "completed", record.error
        derived, _ = await im.row("logo")

    thumb = opened(media / derived["thumbnail_150"])
    assert derived["thumbnail_150"] == "derived/logo/thumb_150.png"
    assert (thumb.format, thumb.mode, thumb.size) == ("PNG", "RGBA", (150, 100))
    assert thumb.getpixel((10, 50)) == (*GREEN, 255)
    assert thumb.getpixel((140, 50))[3] == 0


async def test_thumbnail_never_enlarges_and_gifs_become_jpeg_or_png(image_config: pipeline.Config, media: Path) -> None:
    make_gif(media / "anim.gif")
    make_gif(media / "clear.gif", transparent=True)
    async with running_images(image_config) as im:
        await im.add_media("g1", "anim.gif", "image/gif")
        await im.add_media("g2", "clear.gif", "image/gif")
        records = await im.run(GenerateThumbnail("g1", 300), GenerateThumbnail("g2", 60))
        assert [r.status for r in records] == ["completed", "completed"], [r.error for r in records]
        opaque = opened(media / (await im.row("g1"))[0]["thumbnail_300"])
        clear = opened(media / (await im.row("g2"))[0]["thumbnail_60"])

    assert (opaque.format, opaque.size) == ("JPEG", (120, 80))  # smaller than 300: kept at its size
    assert _close(opaque.getpixel((60, 40)), BLUE)
    assert (clear.format, clear.mode, clear.size) == ("PNG", "RGBA", (60, 40))
    assert clear.getpixel((5, 20)) == (*BLUE, 255) and clear.getpixel((55, 20))[3] == 0


async def test_webp_copies_keep_orientation_and_alpha(image_config: pipeline.Config, media: Path) -> None:
    make_rotated_jpeg(media / "photo.jpg")
    make_alpha_png(media / "logo.png")
    make_gif(media / "anim.gif")
    async with running_images(image_config) as im:
        await im.add_media("m1", "photo.jpg")
        await im.add_media("logo", "logo.png", "image/png")
        await im.add_media("g1", "anim.gif", "image/gif")
        records = await im.run(ConvertWebP("m1"), ConvertWebP("logo"), ConvertWebP("g1"))
        assert [r.status for r in records] == ["completed"] * 3, [r.error for r in records]
        paths = [(await im.row(mid))[0]["webp"] for mid in ("m1", "logo", "g1")]

    assert paths == ["derived/m1/photo.webp", "derived/logo/logo.webp", "derived/g1/anim.webp"]
    photo, logo, gif = (opened(media / p) for p in paths)
    assert {photo.format, logo.format, gif.format} == {"WEBP"}
    assert photo.size == (200, 400) and _close(photo.getpixel((100, 20)), RED) and _close(photo.getpixel((100, 380)), BLUE)
    assert logo.size == (300, 200) and logo.mode == "RGBA"
    assert logo.getpixel((20, 100))[3] == 255 and logo.getpixel((280, 100))[3] == 0
    assert gif.size == (120, 80)


async def test_process_image_applies_operations_in_order(image_config: pipeline.Config, media: Path) -> None:
    make_rotated_jpeg(media / "photo.jpg")
    make_alpha_png(media / "logo.png")
    shrink_then_grow = (Resize(50, 50), Resize(400, 400))
    grow_then_shrink = (Resize(400, 400), Resize(50, 50))
    low = (Resize(100, 100), Compress(20))
    high = (Resize(100, 100), Compress(95))
    async with running_images(image_config) as im:
        await im.add_media("m1", "photo.jpg")
        await im.add_media("logo", "logo.png", "image/png")
        records = await im.run(
            ProcessImage("m1", shrink_then_grow),
            ProcessImage("m1", grow_then_shrink),
            ProcessImage("m1", low),
            ProcessImage("m1", high),
            ProcessImage("logo", (Resize(60, 60), Compress(50))),
        )
        assert [r.status for r in records] == ["completed"] * 5, [r.error for r in records]
        photo_derived, _ = await im.row("m1")
        logo_derived, _ = await im.row("logo")

    def output(derived: dict[str, str], ops: tuple[Any, ...]) -> Path:
        key = f"processed_{operations_hash(ops)}"
        assert derived[key] == f"derived/{Path(derived[key]).parent.name}/{key}.{Path(derived[key]).suffix[1:]}"
        return media / derived[key]

    assert len(photo_derived) == 4  # four different operation lists, four files
    assert opened(output(photo_derived, shrink_then_grow)).size == (200, 400)  # 25x50, then enlarged to fit 400x400
    assert opened(output(photo_derived, grow_then_shrink)).size == (25, 50)
    low_img, high_img = opened(output(photo_derived, low)), opened(output(photo_derived, high))
    assert low_img.format == high_img.format == "JPEG" and low_img.size == high_img.size == (50, 100)
    assert output(photo_derived, low).stat().st_size < output(photo_derived, high).stat().st_size
    logo = opened(output(logo_derived, (Resize(60, 60), Compress(50))))
    assert (logo.format, logo.mode, logo.size) == ("PNG", "RGBA", (60, 40))


async def test_running_twice_gives_the_same_file_and_row(image_config: pipeline.Config, media: Path) -> None:
    make_rotated_jpeg(media / "photo.jpg")
    jobs = (GenerateThumbnail("m1", 120), ConvertWebP("m1"), ProcessImage("m1", (Resize(80, 80), Compress(70))))
    async with running_images(image_config) as im:
        await im.add_media("m1", "photo.jpg")
        await im.run(*jobs)
        first_files, first_row = files_under(media / "derived"), await im.row("m1")
        records = await im.run(*jobs)
        assert [r.status for r in records] == ["completed"] * 3
        second_files, second_row = files_under(media / "derived"), await im.row("m1")

    assert len(first_files) == 3
    assert second_files == first_files  # same names, same bytes, no temporary files left behind
    assert second_row == first_row  # derived unchanged, updated_at untouched


async def test_media_uploaded_makes_thumbnail_and_webp(image_config: pipeline.Config, media: Path) -> None:
    (media / "uploads").mkdir()
    Image.new("RGB", (900, 600), GREEN).save(media / "uploads" / "big.png")
    async with running_images(image_config) as im:
        await im.add_media("up1", "uploads/big.png", "image/png")
        job_ids = await im.p.emit(MediaUploaded("up1"))
        records = await im.wait(job_ids)
        assert sorted(r.job_type for r in records) == ["convert_webp", "generate_thumbnail"]
        assert all(r.status == "completed" for r in records), [r.error for r in records]
        derived, _ = await im.row("up1")

    assert derived == {"thumbnail_300": "derived/up1/thumb_300.jpg", "webp": "derived/up1/big.webp"}
    assert opened(media / derived["thumbnail_300"]).size == (300, 200)  # opaque PNG: JPEG thumbnail
    assert opened(media / derived["webp"]).size == (900, 600)


# -- what the handlers refuse --------------------------------------------------------------------------


def _symlink_out(media: Path, outside: Path) -> tuple[str, str]:
    (media / "link.jpg").symlink_to(outside / "secret.jpg")
    return "link.jpg", "outside MEDIA_DIR"


def _derived_points_out(media: Path, outside: Path) -> tuple[str, str]:
    make_rotated_jpeg(media / "fine.jpg")
    (media / "derived").symlink_to(outside, target_is_directory=True)
    return "fine.jpg", "refusing to write"


def _text_as_jpeg(media: Path, outside: Path) -> tuple[str, str]:
    (media / "notes.jpg").write_text("this is not a picture\n")
    return "notes.jpg", "is not an image this pipeline reads"


def _truncated_jpeg(media: Path, outside: Path) -> tuple[str, str]:
    make_rotated_jpeg(media / "whole.jpg")
    data = (media / "whole.jpg").read_bytes()
    (media / "cut.jpg").write_bytes(data[: len(data) // 2])
    return "cut.jpg", "damaged or cannot be decoded"


def _bomb(media: Path, outside: Path) -> tuple[str, str]:
    (media / "bomb.png").write_bytes(png_header_only(100_000, 100_000))  # 10 gigapixels claimed, 100 bytes on disk
    return "bomb.png", "is a decompression bomb, over Pillow's own limit"


def _bomb_under_pillows_limit(media: Path, outside: Path) -> tuple[str, str]:
    # 100 megapixels: Pillow only warns (its error starts at ~179), IMAGE_MAX_PIXELS (50) refuses
    (media / "bomb.png").write_bytes(png_header_only(10_000, 10_000))
    return "bomb.png", "10000x10000 = 100000000 pixels, over IMAGE_MAX_PIXELS=50000000"


def _directory(media: Path, outside: Path) -> tuple[str, str]:
    (media / "album").mkdir()
    return "album", "not a regular file"


REFUSALS = {
    "symlink pointing out": _symlink_out,
    "dot-dot path": lambda media, outside: ("../outside/secret.jpg", "outside MEDIA_DIR"),
    "absolute path": lambda media, outside: (str(outside / "secret.jpg"), "is absolute"),
    "missing file": lambda media, outside: ("gone.jpg", "'gone.jpg' is missing"),
    "text file named .jpg": _text_as_jpeg,
    "truncated jpeg": _truncated_jpeg,
    "bomb header": _bomb,
    "bomb header under Pillow's limit": _bomb_under_pillows_limit,
    "directory": _directory,
    "derived/ pointing out": _derived_points_out,
}


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("case", list(REFUSALS))
@pytest.mark.parametrize("job_cls", [GenerateThumbnail, ConvertWebP, ProcessImage])
async def test_refused_media_go_dead_at_once_and_write_nothing_outside(
    case: str, job_cls: type, image_config: pipeline.Config, media: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    make_rotated_jpeg(outside / "secret.jpg")
    path, expected = REFUSALS[case](media, outside)
    before = files_under(outside)
    job = {GenerateThumbnail: GenerateThumbnail("bad", 100), ConvertWebP: ConvertWebP("bad"),
           ProcessImage: ProcessImage("bad", (Resize(10, 10),))}[job_cls]
    async with running_images(image_config) as im:
        await im.add_media("bad", path)
        record = await im.run_one(job)
        derived, _ = await im.row("bad")

    assert record.status == "dead" and record.attempts == 1, record  # permanent: no retry
    assert "media 'bad'" in record.error
    assert expected in record.error
    assert derived == {}
    assert files_under(outside) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["media", "outside", *_db_files(tmp_path)])


async def test_image_over_image_max_pixels_is_refused(db_path: Path, media: Path) -> None:
    Image.new("RGB", (100, 100), RED).save(media / "square.png")
    config = fast_config(db_path, media_dir=str(media), image_max_pixels=5_000)
    async with running_images(config) as im:
        await im.add_media("sq", "square.png", "image/png")
        thumb, resize = await im.run(GenerateThumbnail("sq", 50), ProcessImage("sq", (Resize(10, 10),)))
        assert not (media / "derived").exists()

    for record in (thumb, resize):
        assert (record.status, record.attempts) == ("dead", 1)
        assert "100x100 = 10000 pixels, over IMAGE_MAX_PIXELS=5000" in record.error


async def test_resize_beyond_image_max_pixels_is_refused(db_path: Path, media: Path) -> None:
    Image.new("RGB", (100, 100), RED).save(media / "square.png")
    config = fast_config(db_path, media_dir=str(media), image_max_pixels=1_000_000)
    async with running_images(config) as im:
        await im.add_media("sq", "square.png", "image/png")
        record = await im.run_one(ProcessImage("sq", (Resize(5000, 5000),)))
        assert not (media / "derived").exists()

    assert (record.status, record.attempts) == ("dead", 1)
    assert "Resize to 5000x5000 would make a 5000x5000 image, over IMAGE_MAX_PIXELS=1000000" in record.error


async def test_unknown_media_id_is_permanent(image_config: pipeline.Config) -> None:
    async with running_images(image_config) as im:
        record = await im.run_one(ConvertWebP("no-such-media"))
    assert (record.status, record.attempts) == ("dead", 1)
    assert "media 'no-such-media' not found" in record.error


async def test_media_dir_missing_names_the_setting(db_path: Path, tmp_path: Path) -> None:
    config = fast_config(db_path, media_dir=str(tmp_path / "nowhere"))
    async with running_images(config) as im:
        await im.p.resources["content"].run(lambda conn: conn.execute("INSERT INTO media (id, path) VALUES ('m', 'a.jpg')"))
        record = await im.run_one(GenerateThumbnail("m", 10))
    assert record.status == "dead" and "MEDIA_DIR" in record.error and "is not a directory" in record.error


async def test_thread_count_can_be_chosen(image_config: pipeline.Config) -> None:
    registry = default_registry(image_config)
    images.install(registry, image_config, threads=1)
    async with pipeline.open_pipeline(image_config, registry) as p:
        assert p.resources["images"].limiter.total_tokens == 1
    with pytest.raises(ValueError, match="image threads must be >= 1"):
        images.install(registry, image_config, threads=0)


# -- the pure parts ------------------------------------------------------------------------------------


def test_fit_within_keeps_aspect_ratio() -> None:
    assert fit_within((400, 200), (100, 100)) == (100, 50)
    assert fit_within((200, 400), (100, 100)) == (50, 100)
    assert fit_within((10, 10), (300, 200)) == (200, 200)  # enlarges to fit, as the seed's image crate does
    assert fit_within((10_000, 1), (100, 100)) == (100, 1)  # never rounds a side to zero


def test_derived_names_are_stable_and_safe() -> None:
    assert operations_hash((Resize(1, 2), Compress(3))) == operations_hash([Resize(1, 2), Compress(3)])
    assert operations_hash((Resize(1, 2), Compress(3))) != operations_hash((Compress(3), Resize(1, 2)))
    assert derived_dir_name("0190a1b2-c3d4") == "0190a1b2-c3d4"
    for hostile in ("..", "../../etc", "a/b", ".hidden", ""):
        name = derived_dir_name(hostile)
        assert name.startswith("id-") and "/" not in name and name == derived_dir_name(hostile)


def _close(pixel: Any, colour: tuple[int, int, int], tolerance: int = 40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], colour))


def _db_files(tmp_path: Path) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if p.name.startswith("pipeline.db")]


# -- bounded work per job (issue 15) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("operations", "bound"),
    [([{"Resize": {"width": 10, "height": 10}}] * 17, "<= 16"),
     ([{"Resize": {"width": 16_385, "height": 10}}], "'width' must be <= 16384"),
     ([{"Resize": {"width": 10, "height": 100_000}}], "'height' must be <= 16384")],
    ids=["17-operations", "wide", "tall"],
)
async def test_process_image_over_its_bounds_is_refused_at_enqueue(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], operations: list[Any], bound: str
) -> None:
    payload = json.dumps({"media_id": "m", "operations": operations})
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{db_path}")
    assert cli.main(["--env-file", str(db_path.parent / "none.env"), "enqueue", "process_image", "--payload", payload]) == 2
    assert bound in capsys.readouterr().err

    from test_admin_api import api_config, assert_error, served

    async with served(api_config(db_path)) as (_, client):
        r = await client.post("/admin/jobs", json={"job_type": "process_image", "payload": json.loads(payload)})
        assert_error(r, 422, bound)
        assert (await client.get("/admin/jobs")).json()["total"] == 0
    ProcessImage("m", (Resize(16_384, 16_384),) * 16)  # the bounds themselves are allowed


def _one_pair() -> float:
    """Seconds the job's pair of operations (4000 px up, 1000 px down) takes here, decode included."""
    started = time.perf_counter()
    Image.new("RGB", (1000, 1000), RED).resize((4000, 4000)).resize((1000, 1000))
    return time.perf_counter() - started


async def test_a_timeout_stops_process_image_between_operations(db_path: Path, media: Path) -> None:
    """16 resizes of a large image take seconds in an image thread; the job's timeout of
    0.4 s stops them at the next operation, not when all are done, and the message does
    not blame the event loop alone (the loop was free: the work ran in a thread)."""
    Image.new("RGB", (1000, 1000), RED).save(media / "big.png")
    config = fast_config(db_path, media_dir=str(media), worker_job_timeout_seconds=0.4)
    operations = (Resize(4000, 4000), Resize(1000, 1000)) * 8
    async with running_images(config) as im:
        await im.add_media("big", "big.png", "image/png")
        pair = await trio.to_thread.run_sync(_one_pair)  # the machine's pace now (a loaded one is slower)
        started = trio.current_time()
        job_id = await im.p.enqueue(ProcessImage("big", operations), max_attempts=1)
        (record,) = await im.wait([job_id])
        took = trio.current_time() - started
        pair = max(pair, await trio.to_thread.run_sync(_one_pair))
        assert not (media / "derived").exists() or not any((media / "derived").rglob("*.*"))

    assert (record.status, record.attempts) == ("dead", 1)
    assert record.error.startswith("timed out after 0.4 s"), record.error
    # all eight pairs would take 8 × pair; stopped at the next operation, the job takes its timeout and
    # at most the pair it was in (and its decode), with half a second for the rest
    assert took < 0.4 + 2 * pair + 0.5 < 8 * pair, f"the job ran {took:.1f} s (a pair of operations {pair:.2f} s): the operations went on after the timeout"
    if "blocking the event loop" in record.error:  # a slow operation made the timeout late: both causes named
        assert "waiting on such a thread" in record.error
