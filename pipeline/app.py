"""The application ``python -m pipeline`` runs: ``--app MODULE:ATTR`` or ``PIPELINE_APP``.

``ATTR`` names a :class:`~pipeline.Registry`, or a callable returning one (given the
:class:`~pipeline.Config` if it takes an argument). ``MODULE`` is imported the way ``python -m``
imports, the working directory first. Whatever goes wrong — a module that cannot be imported
(or raises while it is), a missing attribute, something that is not a registry — is an
:class:`AppError` (a ConfigError: exit status 2) naming what was asked and what was found.

The bundled site is an application like any other, ``pipeline.site:registry`` (the default),
loaded by name: the engine imports nothing of it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from .errors import ConfigError
from .registry import Registry

if TYPE_CHECKING:
    from .config import Config

APP_VARIABLE = "PIPELINE_APP"
SITE_APP = "pipeline.site:registry"  # the default: the bundled blog


class AppError(ConfigError):
    """The application named by ``--app`` / ``PIPELINE_APP`` cannot be loaded."""


@attrs.frozen
class App:
    """What ``--app`` (or ``PIPELINE_APP``) named, found: call :meth:`registry` for the registry."""

    name: str  # MODULE:ATTR, as asked
    asked: str  # how it was asked, for messages: "--app 'myapp:registry'" or "PIPELINE_APP='myapp:registry'"
    target: Any  # the attribute: a Registry, or a callable returning one

    @property
    def is_site(self) -> bool:
        return self.name == SITE_APP

    def registry(self, config: Config | Callable[[], Config]) -> Registry:
        """The application's registry: the attribute itself, or what calling it returns (with
        the config, when it takes an argument; ``config`` may be a function making it, called
        only then)."""
        target = self.target
        if isinstance(target, Registry):
            return target
        attr = self.name.partition(":")[2]
        args: tuple[Any, ...] = ()
        call = f"{attr}()"
        if _takes_an_argument(target):
            args, call = (config() if callable(config) else config,), f"{attr}(config)"
        try:
            result = target(*args)
        except ConfigError:
            raise  # a setting the application refused names itself
        except Exception as exc:  # noqa: BLE001 - the application's own failure, reported as a bad app
            raise AppError(f"{self.asked}: {call} raised {_described(exc)}") from exc
        if not isinstance(result, Registry):
            raise AppError(f"{self.asked}: {call} returned {_kind(result)}, not a pipeline.Registry")
        return result


def load_app(name: str, *, asked: str | None = None) -> App:
    """Import ``MODULE`` of ``MODULE:ATTR`` (the working directory first, as ``python -m``
    does) and find ``ATTR`` in it (dots reach inside: ``myapp:jobs.registry``)."""
    asked = asked or f"--app {name!r}"
    module_name, colon, attr = name.strip().partition(":")
    if not colon or not module_name or not attr or not all(part.isidentifier() for part in (*module_name.split("."), *attr.split("."))):
        raise AppError(f"{asked}: expected MODULE:ATTR, a module and the name in it of a pipeline.Registry or of a "
                       "function returning one (e.g. myapp:registry)")
    if module_name.partition(".")[0] != "pipeline":  # (the bundled site needs no path: a caller's sys.path stays as it was)
        _working_directory_first()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name) and module_name[len(exc.name):][:1] in ("", "."):
            raise AppError(f"{asked}: cannot import module {module_name!r}: {exc} (looked in the working directory "
                           f"{os.getcwd()} and on the Python path)") from exc
        raise AppError(f"{asked}: importing module {module_name!r} failed: {_described(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 - the module's own code failed: said as a bad app, with where
        raise AppError(f"{asked}: importing module {module_name!r} failed: {_described(exc)}") from exc
    target: Any = module
    for i, part in enumerate(attr.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            where = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            found = _registries_in(module) if i == 0 else []
            hint = f"; the registries in it: {', '.join(found)}" if found else ""
            raise AppError(f"{asked}: {where} ({_file_of(module)}) has no attribute {part!r}{hint}") from None
    if not isinstance(target, Registry) and (not callable(target) or isinstance(target, type) and not issubclass(target, Registry)):
        raise AppError(f"{asked}: {module_name}:{attr} is {_kind(target)}, not a pipeline.Registry or a callable "
                       "returning one")
    return App(name.strip(), asked, target)


def _working_directory_first() -> None:
    """``python -m`` puts the working directory first on the path; the ``pipeline`` console
    script and an application's own entry point do not: the app is found there all the same."""
    cwd = os.getcwd()
    for entry in sys.path:
        try:
            if os.path.realpath(entry or os.curdir) == os.path.realpath(cwd):
                return
        except (OSError, ValueError):
            continue
    sys.path.insert(0, cwd)


def _takes_an_argument(target: Any) -> bool:
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called without
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


def _registries_in(module: Any) -> list[str]:
    return sorted(name for name, value in vars(module).items() if isinstance(value, Registry))


def _file_of(module: Any) -> str:
    return getattr(module, "__file__", None) or "a namespace package"


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    text = repr(value)
    return f"a {type(value).__name__}" + (f" ({text})" if len(text) <= 60 else "")


def _described(exc: BaseException) -> str:
    """The exception's type and message, and where in the application's code it was raised."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError):
        return text  # its message names the file and line
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "importlib" not in f.filename]
    if ours:
        last = ours[-1]
        text += f" ({last.filename}, line {last.lineno})"
    return text
