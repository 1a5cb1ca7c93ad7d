"""Mermaid drawings generated from the code: the state machine from ``states.TRANSITIONS``,
the actor topology from the channels ``open_pipeline`` actually creates (``Wiring``).

``python -m pipeline diagrams`` rewrites ``diagrams/*.mmd`` and their copies in
docs/architecture.md; tests/test_core_units.py fails when the files and the code disagree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import trio

from ..states import TRANSITIONS, Status


@attrs.define
class Wiring:
    """Records every channel the wiring creates, as an edge of the topology."""

    edges: list[tuple[str, str, str]] = attrs.field(factory=list)

    def channel(self, src: str, dst: str, label: str, size: int, *, size_label: str | None = None) -> tuple[Any, Any]:
        self.edge(src, dst, f"{label} [{size_label or size}]")
        return trio.open_memory_channel(size)

    def edge(self, src: str, dst: str, label: str) -> None:
        if (src, dst, label) not in self.edges:
            self.edges.append((src, dst, label))


def _node(name: str) -> str:
    return re.sub(r"\W", "_", name)


def state_diagram() -> str:
    lines = ["stateDiagram-v2", f"    [*] --> {Status.PENDING}: enqueue", f"    [*] --> {Status.WAITING}: enqueue with after= (parents not all completed)"]
    for transition, (src, dst) in TRANSITIONS.items():
        lines.append(f"    {src} --> {dst}: {transition.value}")
    lines.append(f"    {Status.COMPLETED} --> [*]")
    return "\n".join(lines) + "\n"


def topology_diagram(wiring: Wiring) -> str:
    lines = ["flowchart LR"]
    names = []
    for src, dst, _ in wiring.edges:
        for name in (src, dst):
            if name not in names:
                names.append(name)
    for name in names:
        lines.append(f'    {_node(name)}["{name}"]')
    for src, dst, label in wiring.edges:
        lines.append(f'    {_node(src)} -->|"{label}"| {_node(dst)}')
    return "\n".join(lines) + "\n"


def write(folder: Path, wiring: Wiring, readme: Path | None = None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {"states.mmd": state_diagram(), "actors.mmd": topology_diagram(wiring)}
    written = []
    for name, text in files.items():
        (folder / name).write_text(text)
        written.append(folder / name)
    if readme is not None and readme.exists():
        text = readme.read_text()
        for name, body in files.items():
            text = replace_block(text, name, body)
        readme.write_text(text)
        written.append(readme)
    return written


def replace_block(text: str, name: str, body: str) -> str:
    """Swap the ```mermaid block that follows ``<!-- diagrams/NAME -->`` in a Markdown text."""
    pattern = re.compile(rf"(<!-- diagrams/{re.escape(name)} -->\n```mermaid\n)(.*?)(```)", re.S)
    return pattern.sub(lambda m: m.group(1) + body + m.group(3), text)


def readme_block(text: str, name: str) -> str | None:
    m = re.search(rf"<!-- diagrams/{re.escape(name)} -->\n```mermaid\n(.*?)```", text, re.S)
    return m.group(1) if m else None
