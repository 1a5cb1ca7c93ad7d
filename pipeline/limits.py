"""Each job type's limits across processes as the service applies them: its registration's, under
what WORKER_GLOBAL_LIMITS and WORKER_RATE_LIMITS say (the variables win). The engine applies them,
the CLI, the admin API and the dashboard show them: one reading for all."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import Config
    from .registry import Registry


def global_limits(config: Config, registry: Registry) -> dict[str, int]:
    """Each type's global limit: WORKER_GLOBAL_LIMITS, else its registration's. A type the variable
    names that the registry does not know is refused (a typo would leave the type it meant without
    its limit)."""
    configured = config.worker.global_limits
    _known(config.worker.global_limits_text, "WORKER_GLOBAL_LIMITS", configured, registry)
    limits = {name: spec.global_limit for name in registry.job_types()
              if (spec := registry.spec(name)).global_limit is not None}
    return {**limits, **configured}


def rate_limits(config: Config, registry: Registry) -> dict[str, tuple[int, float]]:
    """Each type's rate limit, (starts, window seconds): WORKER_RATE_LIMITS, else its registration's;
    a type the variable names that the registry does not know is refused, as WORKER_GLOBAL_LIMITS's."""
    configured = config.worker.rate_limits
    _known(config.worker.rate_limits_text, "WORKER_RATE_LIMITS", configured, registry)
    rates = {name: spec.rate_limit for name in registry.job_types()
             if (spec := registry.spec(name)).rate_limit is not None}
    return {**rates, **configured}


_UNITS = {1.0: "s", 60.0: "m", 3600.0: "h"}


def rate_text(rate: tuple[int, float]) -> str:
    """(10, 1.0) → "10/s", as the settings write it."""
    n, window = rate
    return f"{n}/{_UNITS.get(window, f'{window:g}s')}"


def _known(text: str, variable: str, configured: Collection[str], registry: Registry) -> None:
    unknown = sorted(set(configured) - set(registry.job_types()))
    if unknown:
        raise ConfigError(f"{variable}={text!r} names job types this service does not know: {', '.join(unknown)} "
                          f"(known: {', '.join(registry.job_types()) or 'none'})")
