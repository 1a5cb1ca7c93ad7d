"""DATABASE_URL: which job stores it can name, and how its password is kept out of sight."""

from __future__ import annotations

import io

import pytest

from pipeline import Config
from pipeline.cli import main
from pipeline.config import masked_url
from pipeline.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("sqlite:///jobs.db", "sqlite"),
        ("postgresql://app:pw@db.example:5432/jobs?sslmode=require", "postgres"),
        ("postgres://localhost/jobs", "postgres"),
        ("redis://localhost:6379/0", "redis"),
        ("rediss://:pw@cache.example:6380/2", "redis"),
    ],
)
def test_each_store_is_named_by_its_scheme(url: str, kind: str) -> None:
    assert Config(database_url=url).backend == kind


@pytest.mark.parametrize("url", ["mysql://app:MARKER@host/db", "sqlite://relative.db", "http://host/", "redis:/x"])
def test_another_scheme_is_refused_naming_the_three(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({"DATABASE_URL": url}, env_file=None)
    message = str(caught.value)
    assert "MARKER" not in message
    assert all(form in message for form in ("sqlite:///", "postgresql://", "redis://"))


def test_the_cli_exits_2_on_another_scheme(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DATABASE_URL", "mysql://app:MARKER@host/db")
    monkeypatch.chdir("/")  # no .env of the working tree
    assert main(["stats"], stdout=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "postgresql://" in err and "MARKER" not in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:MARKER@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
        ("postgresql://app:MAR@KER@db/jobs", "postgresql://app:***@db/jobs"),  # an unescaped @ in the password
        ("postgres://:MARKER@db/jobs", "postgres://:***@db/jobs"),
        ("postgresql://app@db/jobs?sslmode=require&password=MARKER", "postgresql://app@db/jobs?sslmode=require&password=***"),
        ("postgresql://db/jobs?sslpassword=MARKER&sslmode=verify-full", "postgresql://db/jobs?sslpassword=***&sslmode=verify-full"),
        ("postgresql://app:MARKER@h1:5432,h2:5433/jobs", "postgresql://app:***@h1:5432,h2:5433/jobs"),
        ("redis://:MARKER@cache:6379/0", "redis://:***@cache:6379/0"),
        ("rediss://user:MARKER@cache:6380/1", "rediss://user:***@cache:6380/1"),
        ("sqlite:///data/a@b:c.db", "sqlite:///data/a@b:c.db"),
        ("postgresql://app@db/jobs", "postgresql://app@db/jobs"),
    ],
)
def test_masked_url_hides_the_password_in_every_form(url: str, shown: str) -> None:
    assert masked_url(url) == shown
    assert "MARKER" not in repr(Config(database_url=url)) and "KER" not in masked_url(url)
