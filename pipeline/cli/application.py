"""The application the commands work for (--app, PIPELINE_APP, the bundled site, or the registry a
program gives ``main``), and what --help says of it."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import attrs

from ..app import APP_VARIABLE, SITE_APP, App, load_app
from ..config import Config
from ..errors import UsageError
from ..registry import Registry

APP_HELP = ("the application: a module and the name in it of a pipeline.Registry, or of a function returning one "
            "(given the Config if it takes an argument), e.g. myapp:registry; the working directory is importable. "
            f"Default: {APP_VARIABLE}, else {SITE_APP} (the bundled blog)")


@attrs.define
class Application:
    """The application the commands work for: the one --app or PIPELINE_APP names (the bundled
    site by default), or the registry a program gave ``main(registry=...)``."""

    name: str  # MODULE:ATTR; or what the program is, for a registry given in code
    app: App | None = None
    given: Registry | None = None
    _registry: Registry | None = attrs.field(default=None, init=False)  # the app's, once made (a factory is called once)

    @property
    def is_site(self) -> bool:
        return self.app is not None and self.app.is_site

    @property
    def command(self) -> str:
        """How a person runs these commands again, as hints print it: with the --app in use (the
        bundled site needs none), or the program that gave its registry."""
        if self.given is not None:
            program = Path(sys.argv[0]).name
            return f"python {program}" if program.endswith(".py") else "python -m pipeline"
        return "python -m pipeline" if self.is_site else f"python -m pipeline --app {self.name}"

    def registry(self, config: Config | Callable[[], Config]) -> Registry:
        """The registry with its handlers: what the service runs (the site's: every handler, its
        settings checked)."""
        if self.given is not None:
            return self.given
        if self._registry is None:
            assert self.app is not None
            self._registry = self.app.registry(config)
        return self._registry

    def types(self, config: Config | Callable[[], Config]) -> Registry:
        """What the commands check jobs and events against: they run no handler. For the bundled
        site, its types alone: importing its handlers (httpx, Pillow, redis) would only slow every
        command down. Any other application's registry is what it is."""
        if self.is_site:
            from ..site import types_registry

            return types_registry()
        return self.registry(config)


def choose_application(app: str | None, env_file: str | None, registry: Registry | None) -> Application:
    """--app, else PIPELINE_APP (the environment, then the env file), else the bundled site; or
    the registry the program gave, which nothing on the command line replaces."""
    if registry is not None:
        if app is not None:
            raise UsageError("--app is not taken here: this program gives its registry to pipeline.cli.main(registry=...) "
                             "itself (python -m pipeline --app runs another)")
        return Application(f"the registry {Path(sys.argv[0]).name or 'this program'} gives pipeline.cli.main()", given=registry)
    asked = f"--app {app!r}"
    if app is None:
        app = os.environ.get(APP_VARIABLE, "").strip() or None
        asked = f"{APP_VARIABLE}={app!r}"
    if app is None and env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values

        app = (dotenv_values(env_file).get(APP_VARIABLE) or "").strip() or None
        asked = f"{APP_VARIABLE}={app!r} (in {env_file})"
    if app is None:
        app, asked = SITE_APP, f"the default app {SITE_APP!r}"
    loaded = load_app(app, asked=asked)
    return Application(loaded.name, app=loaded)


@attrs.frozen
class AppSummary:
    """What --help says of the application."""

    name: str
    option: str  # what the examples put before the command: " --app myapp:registry", or nothing
    site: bool
    job_types: list[str]
    events: list[str]
    schedules: list[str]

    @classmethod
    def of(cls, application: Application, registry: Registry) -> AppSummary:
        option = f" --app {application.name}" if application.app is not None and not application.is_site else ""
        return cls(application.name, option, application.is_site, registry.job_types(), registry.event_names(),
                   [s.name for s in registry.schedules()])

    def description(self) -> str:
        named = f"{self.name} (the bundled blog; --app or {APP_VARIABLE} names another)" if self.site else self.name
        lines = [f"app: {named}", f"job types: {', '.join(self.job_types) or 'none'}"]
        if self.events:
            lines.append(f"events: {', '.join(self.events)}")
        if self.schedules:
            lines.append(f"schedules in its code: {', '.join(self.schedules)}")
        return "\n".join(textwrap.fill(line, 100, subsequent_indent="  ") for line in lines)

    def examples(self, text: str) -> str:
        """The bundled site's examples, for another app written with its own first job type."""
        if self.site or not self.job_types:
            return text
        app, first = self.option, self.job_types[0]
        out = []
        for line in text.splitlines():
            if "python -m pipeline" in line and any(t in line for t in ("send_email", "generate_sitemap")):
                line = line.replace("python -m pipeline", f"python -m pipeline{app}")
                line = re.sub(r"'\{.*\}'", "'{...}'", line)
                line = line.replace("send_email", first).replace("generate_sitemap", first).replace("nightly-sitemap", "nightly")
            elif "python -m pipeline" in line:
                line = line.replace("python -m pipeline", f"python -m pipeline{app}")
            elif "invalidate_cache" in line:
                line = f'  {{"job_type": "{first}", "payload": {{...}}, "priority": 3}}'
            out.append(line)
        return "\n".join(out) + "\n"
