"""Ready to publish (issue 34, item 6): `python -m build` makes an sdist and a wheel of the version in
pyproject.toml, `twine check --strict` passes both, their metadata is complete (license, classifiers PyPI
accepts, project URLs, the README as the long description), the sdist carries every file of the package
(the dashboard's static files, the Lua scripts, py.typed), and CHANGELOG.md has the version and the
migrations it brings.

The two files are tests/test_wheel.py's build (started as the run begins, early.py): the suite builds once.
That test installs the wheel, built from the unpacked sdist, and runs the service from it."""

from __future__ import annotations

import email
import email.message
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import early
import pytest
import trove_classifiers
from test_wheel import WHEEL

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]


@pytest.fixture(scope="module")
def dist() -> Path:
    built, folder = early.result(WHEEL, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return folder / "dist"


def _metadata(text: str) -> email.message.Message:
    return email.message_from_string(text)


def _wheel_metadata(wheel: Path) -> tuple[email.message.Message, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        return _metadata(archive.read(f"trio_pipeline-{VERSION}.dist-info/METADATA").decode()), names


def _sdist_members(sdist: Path) -> tuple[email.message.Message, list[str]]:
    top = f"trio_pipeline-{VERSION}/"
    with tarfile.open(sdist) as archive:
        names = [m.name for m in archive.getmembers() if m.isfile()]
        assert all(name.startswith(top) for name in names), names
        pkg_info = archive.extractfile(top + "PKG-INFO")
        assert pkg_info is not None
        return _metadata(pkg_info.read().decode()), [name.removeprefix(top) for name in names]


@pytest.mark.slow
def test_build_makes_an_sdist_and_a_wheel_of_the_version_and_twine_passes_both(dist: Path) -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", VERSION), VERSION  # a release version, PEP 440
    assert sorted(p.name for p in dist.iterdir()) == [f"trio_pipeline-{VERSION}-py3-none-any.whl",
                                                      f"trio_pipeline-{VERSION}.tar.gz"]
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *sorted(map(str, dist.iterdir()))],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout


@pytest.mark.slow
def test_the_metadata_is_complete(dist: Path) -> None:
    wheel, names = _wheel_metadata(dist / f"trio_pipeline-{VERSION}-py3-none-any.whl")
    sdist, _ = _sdist_members(dist / f"trio_pipeline-{VERSION}.tar.gz")
    for meta in (wheel, sdist):
        assert meta["Name"] == "trio-pipeline" and meta["Version"] == VERSION
        assert meta["Summary"] and meta["Requires-Python"] == ">=3.11"
        assert meta["License-Expression"] == "MIT" and meta.get_all("License-File") == ["LICENSE"]
        # the long description is the README, as PyPI shows it (Markdown)
        assert meta["Description-Content-Type"] == "text/markdown"
        assert meta.get_payload().strip() == (ROOT / "README.md").read_text().strip()
        assert meta["Author"] or meta["Author-email"]
        assert meta["Keywords"]
        urls = meta.get_all("Project-URL") or []
        assert urls and all(re.fullmatch(r"[^,]+, https://\S+", url) for url in urls), urls
        classifiers = meta.get_all("Classifier") or []
        unknown = [c for c in classifiers if c not in trove_classifiers.classifiers]
        assert unknown == []  # PyPI refuses an upload with a classifier it does not know
        here = f"Programming Language :: Python :: {sys.version_info.major}.{sys.version_info.minor}"
        for wanted in ("Typing :: Typed", "Framework :: Trio", here):
            assert wanted in classifiers, wanted
        assert any(c.startswith("Development Status :: ") for c in classifiers)
    assert f"trio_pipeline-{VERSION}.dist-info/licenses/LICENSE" in names


@pytest.mark.slow
def test_the_sdist_and_the_wheel_carry_every_file_of_the_package(dist: Path) -> None:
    """Every file of the source's pipeline/ (caches aside): the .py modules of every package, and the
    package data (the dashboard's static files, the Redis store's Lua scripts, py.typed). A new kind of
    file that pyproject's package-data does not name, or a folder that is no package, is missing here."""
    _, in_wheel = _wheel_metadata(dist / f"trio_pipeline-{VERSION}-py3-none-any.whl")
    _, in_sdist = _sdist_members(dist / f"trio_pipeline-{VERSION}.tar.gz")
    source = {path.relative_to(ROOT).as_posix() for path in (ROOT / "pipeline").rglob("*")
              if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}
    data = {name for name in source if not name.endswith(".py")}
    assert {"pipeline/py.typed", "pipeline/admin/static/dashboard.js", "pipeline/backends/redis/lua/claim.lua"} <= data
    assert sorted(source - set(in_wheel)) == []
    assert sorted(source - set(in_sdist)) == []
    assert {"PKG-INFO", "pyproject.toml", "README.md", "LICENSE"} <= set(in_sdist)
    # the sdist carries no build leftovers of this checkout
    assert not [name for name in in_sdist if "__pycache__" in name or name.endswith(".pyc")]


def test_the_changelog_names_the_version_and_the_migrations_it_brings() -> None:
    """CHANGELOG.md's newest section is this version's, and it names the schema versions the stores
    migrate to: a new migration without its entry fails here."""
    from pipeline.backends.postgres.schema import LATEST as POSTGRES_LATEST
    from pipeline.backends.sqlite.migrations import MIGRATIONS as SQLITE_MIGRATIONS

    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\S+)", text, re.M)
    assert versions and versions[0] == VERSION, versions
    newest = text.split("\n## ")[1]
    sqlite_latest = max(version for version, _, _ in SQLITE_MIGRATIONS)
    assert f"SQLite schema {sqlite_latest}" in newest and f"Postgres schema {POSTGRES_LATEST}" in newest
