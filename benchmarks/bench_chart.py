"""The chart of bench.py's figures, drawn with Pillow (already a runtime dependency, so
the benchmark needs no plotting library): medians as bars, min–max as whiskers, the
pipeline next to Huey's SQLite backend, the issue's targets as dashed lines."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

OURS = (37, 99, 235)
HUEY = (234, 128, 32)
INK = (30, 30, 30)
GRID = (225, 225, 225)
TARGET = (200, 30, 30)

WIDTH, HEIGHT = 1500, 900


def font(size: int) -> Any:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow built without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def count(n: int) -> str:
    """1,000,000 as 1M, 20,000 as 20k: chart labels."""
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 1000 and n % 100 == 0:
        return f"{n / 1000:g}k"
    return f"{n:,}"


def draw(figs: dict[str, Any], path: Path, *, title: str, scale_rows: int, poll_ms: int, callers: int) -> None:
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    d = ImageDraw.Draw(image)
    d.text((40, 20), title, fill=INK, font=font(28))
    legend(d, 40, 62)
    throughput = [
        (k, label) for k, label in (
            ("drain", "drain"), ("enqueue", f"durable enqueue\n{callers} callers"), ("bulk", "bulk\nenqueue_many"),
            ("cli", "CLI\n--from-file"), ("drain_scale", f"drain, {count(scale_rows)} rows\nin the table"), ("procs1", "drain,\n1 process"),
            ("procs2", "drain,\n2 processes"),
        ) if k in figs
    ]
    if throughput:
        panel_bars(d, (40, 110, 850, 840), "throughput, jobs/s (higher is better)", figs, throughput, log=False,
                   targets={"drain": drain_target(figs), "enqueue": 20_000, "bulk": 50_000, "cli": 50_000})
    latency = [
        (k, label) for k, label in (
            ("latency_p50", "p50 from\nreturn"), ("latency_p99", "p99 from\nreturn"),
            ("latency_call_p50", "p50 from\ncall"), ("latency_call_p99", "p99 from\ncall"),
            ("cross_p50", "p50 other\nprocess"), ("cross_p99", "p99 other\nprocess"),
        ) if k in figs
    ]
    if latency:
        title = f"pickup latency, ms (log scale; other process: poll {poll_ms} ms)"
        panel_bars(d, (900, 110, 1470, 560), title, figs, latency, log=True,
                   targets={"latency_p50": 1, "latency_p99": 5, "cross_p99": poll_ms})
    memory = [(k, label) for k, label in (("rss_small", "small\nbacklog"), ("rss_large", f"{count(scale_rows)} pending\njobs"))
              if k in figs]
    if memory:
        panel_bars(d, (900, 620, 1470, 840), "peak RSS of the service, MB", figs, memory, log=False, targets={"rss_large": 200})
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, optimize=True)


def drain_target(figs: dict[str, Any]) -> float:
    """At least 20,000 jobs/s and at least 5x Huey's median."""
    huey = figs["drain"].huey if "drain" in figs else []
    return max(20_000.0, 5 * statistics.median(huey)) if huey else 20_000.0


def legend(d: ImageDraw.ImageDraw, x: int, y: int) -> None:
    f = font(18)
    for color, text in ((OURS, "pipeline"), (HUEY, "Huey, SqliteHuey + thread workers")):
        d.rectangle((x, y + 3, x + 16, y + 19), fill=color)
        d.text((x + 24, y), text, fill=INK, font=f)
        x += 40 + int(d.textlength(text, font=f))
    d.line((x, y + 11, x + 30, y + 11), fill=TARGET, width=2)
    d.text((x + 38, y), "target", fill=INK, font=f)


def panel_bars(
    d: ImageDraw.ImageDraw,
    box: tuple[int, int, int, int],
    title: str,
    figs: dict[str, Any],
    items: Sequence[tuple[str, str]],
    *,
    log: bool,
    targets: dict[str, float],
) -> None:
    x0, y0, x1, y1 = box
    small, label_font = font(15), font(16)
    d.text((x0, y0), title, fill=INK, font=font(20))
    top, bottom = y0 + 40, y1 - 50  # plot area; labels below
    left = x0 + 70
    values = [v for k, _ in items for v in (*figs[k].ours, *figs[k].huey)] + [targets[k] for k, _ in items if k in targets]
    hi = max(values) * 1.15
    lo = min(v for v in values if v > 0) / 2 if log else 0.0

    def y_of(v: float) -> float:
        if log:
            v = max(v, lo)
            return bottom - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (bottom - top)
        return bottom - v / hi * (bottom - top)

    for tick in ticks(lo, hi, log):
        y = y_of(tick)
        d.line((left, y, x1, y), fill=GRID)
        text = f"{tick:g}" if tick < 1000 else f"{tick / 1000:g}k"
        d.text((left - 8 - d.textlength(text, font=small), y - 8), text, fill=INK, font=small)
    d.line((left, top, left, bottom), fill=INK)
    d.line((left, bottom, x1, bottom), fill=INK)
    slot = (x1 - left) / len(items)
    bar = min(42.0, slot / 3)
    for i, (key, label) in enumerate(items):
        f = figs[key]
        cx = left + slot * (i + 0.5)
        series = [(OURS, f.ours)] + ([(HUEY, f.huey)] if f.huey else [])
        for j, (color, vals) in enumerate(series):
            bx = cx - bar * len(series) / 2 + j * bar
            med = statistics.median(vals)
            d.rectangle((bx + 2, y_of(med), bx + bar - 2, bottom), fill=color)
            if len(vals) > 1:  # min–max whisker
                mid = bx + bar / 2
                d.line((mid, y_of(min(vals)), mid, y_of(max(vals))), fill=INK, width=2)
                for v in (min(vals), max(vals)):
                    d.line((mid - 6, y_of(v), mid + 6, y_of(v)), fill=INK, width=2)
            text = short(med) if med > 0 else "< 0"  # a handler may start before enqueue returns
            tw = d.textlength(text, font=small)
            d.text((bx + bar / 2 - tw / 2, y_of(max(vals)) - 20), text, fill=INK, font=small)
        if key in targets:
            ty = y_of(targets[key])
            for sx in range(int(cx - slot * 0.45), int(cx + slot * 0.45), 12):
                d.line((sx, ty, sx + 6, ty), fill=TARGET, width=2)
        for k, text in enumerate(label.split("\n")):
            tw = d.textlength(text, font=label_font)
            d.text((cx - tw / 2, bottom + 6 + 19 * k), text, fill=INK, font=label_font)


def ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0**e for e in range(math.floor(math.log10(lo)) + 1, math.ceil(math.log10(hi)))]
    step = 10 ** math.floor(math.log10(hi / 2))
    for m in (1, 2, 5, 10):
        if hi / (step * m) <= 6:
            step *= m
            break
    return [step * i for i in range(int(hi // step) + 1)]


def short(v: float) -> str:
    if v >= 10_000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}k"
    if v >= 10:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.1f}"
    return f"{v:.2f}"
