"""``python -m pipeline demo``: run it for real in a temporary folder and read its report."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import early
from conftest import fast_config
from PIL import Image

from pipeline.site import content, types_registry
from pipeline.site.demo import run_demo

ALL_TYPES = {
    "convert_webp": 3, "generate_sitemap": 1, "generate_thumbnail": 3, "invalidate_cache": 7, "process_image": 1,
    "rebuild_search_index": 7, "scheduled_publish": 1, "send_email": 1, "send_welcome_email": 3, "webhook_notify": 6,
}


def job_table(report: str) -> dict[str, tuple[int, int, int, int]]:
    """The 'jobs by type' table: type -> (completed, dead, pending, running)."""
    rows = re.findall(r"^  ([a-z_]+) +(\d+) +(\d+) +(\d+) +(\d+)$", report, re.M)
    return {name: tuple(map(int, counts)) for name, *counts in rows}  # type: ignore[misc]


DEMO = "test_demo.py::test_the_demo_command_shows_every_handler_working"
# started as the run begins (early.py), in a folder of its own
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "SMTP_", "WEBHOOK_", "MEDIA_", "PUBLIC_", "CACHE_"))}
early.command(DEMO, lambda folder: [sys.executable, "-m", "pipeline", "demo", "--dir", "demo"], env=ENV)


def test_the_demo_command_shows_every_handler_working() -> None:
    proc, folder = early.result(DEMO, timeout=90)
    report = proc.stdout
    assert proc.returncode == 0, report + proc.stderr
    root = folder / "demo"
    assert f"pipeline demo in {root}/" in report
    assert re.search(r"^done in \d+\.\d s$", report, re.M)

    table = job_table(report)
    assert table.pop("total") == (sum(ALL_TYPES.values()), 0, 0, 0)
    assert table == {name: (n, 0, 0, 0) for name, n in ALL_TYPES.items()}
    assert "skipped" not in report and "dead:" not in report

    assert re.search(r"^scheduled post demo-launch: published at \S+Z \(due \S+Z\)$", report, re.M)
    assert "search 'trio': 4 hits" in report
    for post in ("demo-hello", "demo-queue", "demo-images", "demo-launch"):
        assert re.search(rf"^  {post} ", report, re.M)
    assert "sitemap entries: 5" in report
    assert "mail received by the SMTP sink: 4" in report
    assert re.search(r"^  to alice@example.com: Welcome to \S+  \[text/plain \+ text/html\]$", report, re.M)
    assert "webhook requests received by the HTTP sink: 6 (signature valid: 6)" in report

    # what the report says is on disk is on disk
    thumb = root / "media" / "derived" / "demo-photo" / "thumb_300.jpg"
    assert "media/derived/demo-photo/thumb_300.jpg" in report
    with Image.open(thumb) as img:
        assert img.size == (200, 300)  # the EXIF "rotate" honoured: upright, long side 300
    locs = [loc.text for loc in ET.parse(root / "public" / "sitemap.xml").getroot().iter("{http://www.sitemaps.org/schemas/sitemap/0.9}loc")]
    assert "http://localhost:8000/posts/fish-&-chips" in locs and "http://localhost:8000/posts/launch-day" in locs
    assert sorted(p.name for p in folder.iterdir()) == ["demo"]  # nothing outside its folder

    # and the search command it suggests finds the same posts
    db_url = f"sqlite:///{root / 'demo.db'}"
    assert f"DATABASE_URL={db_url} python -m pipeline search" in report
    search = subprocess.run(
        [sys.executable, "-m", "pipeline", "search", "trio"], cwd=folder, env={**ENV, "DATABASE_URL": db_url},
        capture_output=True, text=True, timeout=30,
    )
    assert (search.returncode, search.stdout.splitlines()[-1]) == (0, "4 hits")


def test_the_demo_runs_with_whatever_handlers_are_registered_and_again(tmp_path: Path) -> None:
    config = fast_config(tmp_path / "ignored.db")
    registry = types_registry()
    content.install(registry, config)  # publishing, search and sitemap only
    for run in (1, 2):  # a second run re-seeds the same rows and reports only its own jobs
        out = io.StringIO()
        code = run_demo(config, tmp_path / "demo", registry=registry, timeout=30, schedule_ahead=0.5, out=out)
        report = out.getvalue()
        assert code == 0, report
        table = job_table(report)
        assert table["scheduled_publish"] == (1, 0, 0, 0), run
        assert table["rebuild_search_index"] == (7, 0, 0, 0), run
        assert table["send_welcome_email"] == (0, 0, 3, 0), run
        for job_type in ("send_welcome_email", "send_email", "webhook_notify", "invalidate_cache", "generate_thumbnail"):
            assert f"skipped: {job_type} has no handler in this build; its jobs stay pending" in report
        assert "search 'trio': 4 hits" in report
        assert "sitemap entries: 5" in report
        assert "mail received by the SMTP sink: 0" in report
        assert "webhook requests received by the HTTP sink: 0" in report
