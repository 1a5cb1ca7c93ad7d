"""The bundled site's settings, a section per handler, read from the environment when a
handler first asks ``config.section(MailSettings)``. (One light module, not each handler's
own: the commands that only enqueue read them without importing httpx, Pillow or redis.)"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import attrs

from ..config import (
    Config,
    boolean,
    cache_url,
    choice,
    int_at_least,
    port,
    positive_seconds,
    setting,
    site_url,
    text,
    url_list,
    webhook_secret,
)
from ..errors import ConfigError


def _sqlite_url(value: str) -> str:
    value = value.strip()
    if value.startswith("sqlite:///") and len(value) > len("sqlite:///"):
        return value
    raise ValueError("sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db (the site's content is in SQLite)")


@attrs.frozen
class SiteSettings:
    """Where the site's content, media and public files are, and its address."""

    # users, posts, media, the search index; empty: the DATABASE_URL file when that is SQLite, else site.db
    database_url: str = setting("", "SITE_DATABASE_URL", _sqlite_url, url=True)
    url: str = setting("http://localhost:8000", "SITE_URL", site_url)
    media_dir: str = setting("media", "MEDIA_DIR", text)
    public_dir: str = setting("public", "PUBLIC_DIR", text)

    def database_path(self, config: Config) -> Path:
        if self.database_url:
            return Path(self.database_url[len("sqlite:///") :])
        return config.database_path if config.database_url.startswith("sqlite:///") else Path("site.db")


@attrs.frozen
class MailSettings:
    """``send_email`` and ``send_welcome_email``."""

    smtp_host: str = setting("", "SMTP_HOST", text)  # empty: mail jobs fail permanently, naming SMTP_HOST
    smtp_port: int = setting(25, "SMTP_PORT", port)
    smtp_username: str = setting("", "SMTP_USERNAME", text)
    smtp_password: str = setting("", "SMTP_PASSWORD", text, secret=True)
    smtp_security: str = setting("none", "SMTP_SECURITY", choice("none", "starttls", "tls"))
    smtp_timeout: float = setting(30.0, "SMTP_TIMEOUT", positive_seconds)
    mail_from: str = setting("", "MAIL_FROM", text)

    def __attrs_post_init__(self) -> None:
        # Credentials never cross the network in clear text. With SMTP_SECURITY=none the
        # mailer still upgrades with STARTTLS when the server offers it, but a server that
        # does not (or an attacker who strips the offer) would get the password: only a
        # loopback server may be trusted with that.
        if (self.smtp_username or self.smtp_password) and self.smtp_security == "none" and self.smtp_host \
                and not is_loopback_host(self.smtp_host):
            raise ConfigError(
                f"SMTP_USERNAME/SMTP_PASSWORD are set with SMTP_SECURITY=none for SMTP_HOST={self.smtp_host!r}, which is "
                "not a loopback address: the password would cross the network in clear text. Set SMTP_SECURITY=starttls "
                "(usually with SMTP_PORT=587) or SMTP_SECURITY=tls (SMTP_PORT=465)"
            )


def is_loopback_host(host: str) -> bool:
    """localhost, *.localhost, 127.0.0.0/8 or ::1, as written (no name is looked up: what a
    name resolves to can change after this check)."""
    host = host.strip().lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@attrs.frozen
class WebhookSettings:
    """``webhook_notify``, and the events that route to it."""

    urls: tuple[str, ...] = setting((), "WEBHOOK_URLS", url_list, url=True)  # shown with passwords masked
    secret: str = setting("", "WEBHOOK_SECRET", webhook_secret, secret=True)  # whsec_<base64 key>; empty: unsigned
    timeout_seconds: float = setting(10.0, "WEBHOOK_TIMEOUT_SECONDS", positive_seconds)
    allow_private_networks: bool = setting(False, "WEBHOOK_ALLOW_PRIVATE_NETWORKS", boolean)


@attrs.frozen
class ImageSettings:
    """The image handlers."""

    max_pixels: int = setting(50_000_000, "IMAGE_MAX_PIXELS", int_at_least(1))  # decompression-bomb limit


@attrs.frozen
class CacheSettings:
    """``invalidate_cache``."""

    url: str = setting("", "CACHE_URL", cache_url, url=True)  # empty or memory://: in-process; redis://...: Redis


SECTIONS = (SiteSettings, MailSettings, WebhookSettings, ImageSettings, CacheSettings)
