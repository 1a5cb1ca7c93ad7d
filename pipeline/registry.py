"""What this process knows: job types (class, handler, limits), events (class, route), and the
middleware around every handler call.

A new job type is one payload class (attrs, dataclass or pydantic model) plus one handler::

    registry = pipeline.Registry()

    @registry.job(concurrency=4)
    async def resize_avatar(job: ResizeAvatar, ctx: pipeline.JobContext) -> None: ...

(or ``registry.register("resize_avatar", ResizeAvatar, resize_avatar, concurrency=4)``). A plain
``def`` handler runs in a thread of its own (see engine/actors/pools.py); an ``async def`` one on trio, or
with ``runtime="asyncio"`` (or ``Registry(runtime="asyncio")``) as a task of the worker process's asyncio
loop (engine/asyncio_host.py). ``@registry.lifespan`` opens what handlers share (``ctx.state``) once per
worker process.

The registry owns the one cattrs converter (pipeline/payloads.py: the types a payload, an event or
a result can hold and their JSON form), used only at the edges (database rows, HTTP, CLI).
Structuring is strict: a string where an int is expected, a missing field or an unknown key is
refused with a message that names the field. A handler's return annotation is how a result is read
back (``-> datetime``: a datetime); without one, a result is its JSON form.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import json
import re
import types
import typing
from collections import abc
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar, overload

import attrs
import cattrs

from .config import RATE_FORMS, parse_rate
from .errors import InvalidPayload, UnknownEvent, UnknownJobType, UsageError
from .payloads import Unstorable, check_payload, check_result, compact_json, is_pydantic_model, make_converter, show
from .schedules import Schedule, make_schedule

if TYPE_CHECKING:
    from .config import Config
    from .context import JobContext

# ``async def handler(job, ctx)``, or a plain ``def`` run in a thread of its own
Handler = Callable[[Any, "JobContext"], "Awaitable[None] | None"]
F = TypeVar("F", bound=Callable[..., Any])
# middleware(ctx) -> an async context manager entered around each handler call
Middleware = Callable[["JobContext"], AbstractAsyncContextManager[Any]]
M = TypeVar("M", bound=Middleware)
L = TypeVar("L", bound=Callable[..., Any])


@attrs.frozen
class Routed:
    """One job an event leads to, with when it may run (None: now), and its unique key (None:
    none; see Pipeline.enqueue: a duplicate inserts nothing and the emit answers the holder's id)."""

    job: Any
    run_after: dt.datetime | str | None = None
    unique_key: str | None = None


Route = Callable[[Any, "Config"], list[Routed]]
# factory(config, registry) -> an async context manager whose value handlers see as ctx.resources[name]
ResourceFactory = Callable[["Config", "Registry"], AbstractAsyncContextManager[Any]]

MAX_PAYLOAD_BYTES = 1_048_576  # a job's JSON payload (and an event's data) may be at most 1 MiB

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,99}$")

RUNTIMES = ("trio", "asyncio")  # what an ``async def`` handler runs on; a plain ``def`` runs in a thread
# lifespan(), or lifespan(config): an async generator function that opens, yields the state, closes
Lifespan = Callable[..., abc.AsyncIterator[Any]]


@attrs.frozen
class JobSpec:
    name: str
    cls: type
    handler: Handler | None = None  # None: known (can be enqueued, validated) but not run here
    concurrency: int | None = None  # None: WORKER_CONCURRENCY
    timeout: float | None = None  # None: WORKER_JOB_TIMEOUT_SECONDS
    max_attempts: int | None = None  # None: WORKER_DEFAULT_MAX_ATTEMPTS
    global_limit: int | None = None  # running jobs of the type across every process; None: no limit (WORKER_GLOBAL_LIMITS may set one)
    sync: bool = False  # the handler is a plain callable: it runs in a thread (see pools.py)
    # (starts, window seconds): no window of that length sees more starts of the type, across every
    # process sharing the store (WORKER_RATE_LIMITS may set one); None: no rate limit
    rate_limit: tuple[int, float] | None = None
    # the key a job counts under for per-key limits (a tenant): called with the job object at enqueue;
    # None: jobs of the type are not keyed
    limit_key: Callable[[Any], Any] | None = None
    key_limit: int | None = None  # at most this many jobs of one key run at once across every process
    # the registry's middleware, outermost first: filled by Registry.handled() for the pools
    middleware: tuple[Middleware, ...] = ()
    # where the handler runs: "trio" (an async def, on the pipeline's trio loop), "asyncio" (an async
    # def, as a task of the process's asyncio loop: engine/asyncio_host.py) or "thread" (a plain def)
    runtime: str = "trio"
    # what a stored result is read back as (Client.result, ctx.parent_results(), a batch's members):
    # register(returns=...), or the handler's return annotation; None: its JSON form, as stored
    returns: Any = None


@attrs.frozen
class EventSpec:
    name: str
    cls: type
    route: Route


def _explain(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, (TypeError, ValueError)) and str(exc) and not isinstance(exc, cattrs.BaseValidationError):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)


class Registry:
    """Job types and events known to one pipeline. Build it before ``open_pipeline``."""

    def __init__(self, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES, runtime: str = "trio",
                 converter: cattrs.Converter | None = None) -> None:
        """``runtime``: what the ``async def`` handlers registered without their own ``runtime=`` run on,
        and the lifespan's: "trio" (the default) or "asyncio" (a task of the worker process's asyncio loop,
        for asyncpg, redis.asyncio, aiohttp...). A plain ``def`` handler runs in a thread either way.

        ``converter``: a cattrs ``Converter`` with hooks for the types a payload, an event or a result
        holds beyond the pipeline's own (docs/jobs.md, "Payload types"). It is the base: the registry
        copies it (yours is not changed) and registers the pipeline's hooks on the copy, so the table's
        types keep their JSON form and every other type is yours; unknown keys are refused whatever
        the base says. Give it before registering: a class is checked against it at registration."""
        self.runtime = _check_runtime(runtime, "Registry(runtime=...)")
        self.max_payload_bytes = max_payload_bytes
        self._jobs: dict[str, JobSpec] = {}
        self._names_by_cls: dict[type, str] = {}
        self._events: dict[str, EventSpec] = {}
        self._event_names_by_cls: dict[type, str] = {}
        self._resources: dict[str, ResourceFactory] = {}
        self._schedules: dict[str, Schedule] = {}
        self._middleware: list[Middleware] = []
        self._lifespan: Lifespan | None = None
        # What a producer's trace context is now, captured by every enqueue and emit and stored
        # with its jobs (W3C traceparent text, or None for none); set by pipeline.otel.instrument.
        # The core never imports a tracing library: this is the one hook.
        self.trace_context: Callable[[], str | None] | None = None
        self.converter = make_converter(converter)
        self._to_json = compact_json()

    # -- job types -----------------------------------------------------------------------

    def register(
        self,
        name: str,
        cls: type,
        handler: Handler | None = None,
        *,
        concurrency: int | None = None,
        timeout: float | None = None,
        max_attempts: int | None = None,
        global_limit: int | None = None,
        rate_limit: str | None = None,
        limit_key: Callable[[Any], Any] | None = None,
        key_limit: int | None = None,
        runtime: str | None = None,
        returns: Any = None,
    ) -> JobSpec:
        """Declare a job type (or attach a handler to one already declared with the same class).
        ``global_limit``: at most this many of its jobs run at once across every process
        sharing the job store (WORKER_GLOBAL_LIMITS, if it names the type, takes precedence).
        ``rate_limit``: "N/s", "N/m" or "N/h": no window of that length sees more than N of its jobs
        start, across every process (WORKER_RATE_LIMITS takes precedence). ``limit_key``: a function of
        the job giving the key it counts under (a tenant's id); ``key_limit``: at most that many jobs of
        one key run at once, across every process, and due jobs are taken round-robin across keys.
        ``runtime``: "trio" or "asyncio", what an ``async def`` handler runs on (None: the registry's); a
        plain ``def`` handler runs in a thread, and ``runtime="asyncio"`` on one is refused (UsageError).
        ``returns``: the type a stored result is read back as (``Client.result``, ``ctx.parent_results()``, a
        batch's members); None: the handler's return annotation (``-> datetime``), and without one the
        result's JSON form (``returns=typing.Any`` asks for that form whatever the annotation). A process
        that only enqueues, registering the class without the handler, gives it here to read the same."""
        if not _NAME.match(name):
            raise ValueError(f"job type name {name!r} must match {_NAME.pattern}")
        self._check_payload_class(f"job type {name!r}", cls)
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"job type {name!r}: concurrency must be >= 1")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"job type {name!r}: timeout must be > 0")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"job type {name!r}: max_attempts must be >= 1")
        if global_limit is not None and (isinstance(global_limit, bool) or not isinstance(global_limit, int) or global_limit < 1):
            raise ValueError(f"job type {name!r}: global_limit must be an integer >= 1, got {global_limit!r}")
        rate = None
        if rate_limit is not None:
            try:
                if not isinstance(rate_limit, str):
                    raise ValueError(f"a rate limit is text ({RATE_FORMS}), got {rate_limit!r}")
                rate = parse_rate(rate_limit)
            except ValueError as exc:
                raise ValueError(f"job type {name!r}: {exc}") from None
        if key_limit is not None and (isinstance(key_limit, bool) or not isinstance(key_limit, int) or key_limit < 1):
            raise ValueError(f"job type {name!r}: key_limit must be an integer >= 1, got {key_limit!r}")
        if key_limit is not None and limit_key is None:
            raise ValueError(f"job type {name!r}: key_limit needs limit_key, the function giving each job's key")
        if limit_key is not None and not callable(limit_key):
            raise ValueError(f"job type {name!r}: limit_key must be a function of the job, got {limit_key!r}")
        sync = handler is not None and _check_handler(name, handler)
        if runtime is not None:
            _check_runtime(runtime, f"job type {name!r}: runtime")
            if sync and runtime == "asyncio":
                raise UsageError(
                    f"job type {name!r}: runtime='asyncio' is for an `async def` handler, and {_describe(handler)} is a "
                    "plain `def`, which runs in a thread whatever the runtime: make it `async def`, or drop runtime="
                )
        kind = "thread" if sync else (runtime or self.runtime)
        existing = self._jobs.get(name)
        if returns is None and handler is not None:
            returns = _return_annotation(handler)
        elif returns is None and existing is not None:
            returns = existing.returns
        returns = self._check_returns(name, handler, returns)
        if existing is not None and existing.cls is not cls:
            raise ValueError(f"job type {name!r} is already registered with {existing.cls.__name__}")
        other = self._names_by_cls.get(cls)
        if other is not None and other != name:
            # enqueue(obj) finds the type by the object's class: the earlier type could no longer be enqueued
            raise ValueError(f"job type {name!r}: its payload class {cls.__name__} is already job type {other!r}'s; "
                             "give each job type a class of its own")
        spec = JobSpec(name, cls, handler, concurrency, timeout, max_attempts, global_limit, sync, rate_limit=rate,
                       limit_key=limit_key, key_limit=key_limit, runtime=kind, returns=returns)
        self._jobs[name] = spec
        self._names_by_cls[cls] = name
        return spec

    @overload
    def job(self, name: F, /) -> F: ...

    @overload
    def job(
        self, name: str | None = None, *, concurrency: int | None = None, timeout: float | None = None,
        max_attempts: int | None = None, global_limit: int | None = None, rate_limit: str | None = None,
        limit_key: Callable[[Any], Any] | None = None, key_limit: int | None = None, runtime: str | None = None,
    ) -> Callable[[F], F]: ...

    def job(
        self, name: Any = None, *, concurrency: int | None = None, timeout: float | None = None,
        max_attempts: int | None = None, global_limit: int | None = None, rate_limit: str | None = None,
        limit_key: Callable[[Any], Any] | None = None, key_limit: int | None = None, runtime: str | None = None,
    ) -> Any:
        """Decorator: declare a job type by its handler. The payload class is the annotation of
        the handler's first parameter (an attrs class or a dataclass); the type's name is
        ``name``, or the function's name. The function is returned unchanged, so a unit test
        can call it directly. ``@registry.job`` without parentheses works too. Options as
        :meth:`register`'s."""

        def decorate(fn: F) -> F:
            type_name = name if name is not None else getattr(fn, "__name__", None)
            if not isinstance(type_name, str):
                raise TypeError(f"handler {fn!r} has no __name__: name its job type, @registry.job('my_job')")
            self.register(type_name, _payload_class(fn), fn, concurrency=concurrency, timeout=timeout,
                          max_attempts=max_attempts, global_limit=global_limit, rate_limit=rate_limit,
                          limit_key=limit_key, key_limit=key_limit, runtime=runtime)
            return fn

        if callable(name):  # @registry.job, without parentheses
            fn, name = name, None
            return decorate(fn)
        return decorate

    def handle(self, name: str, **options: Any) -> Callable[[Handler], Handler]:
        """Decorator form: attach a handler to an already declared job type."""

        def decorate(fn: Handler) -> Handler:
            self.register(name, self.spec(name).cls, fn, **options)
            return fn

        return decorate

    def spec(self, name: str) -> JobSpec:
        try:
            return self._jobs[name]
        except KeyError:
            known = ", ".join(sorted(self._jobs)) or "none"
            raise UnknownJobType(f"unknown job type {_clip(name)!r} (known: {known})") from None

    def job_types(self) -> list[str]:
        return sorted(self._jobs)

    def handled(self) -> dict[str, JobSpec]:
        """The job types this process runs: those with a handler, each with the middleware
        registered so far (a pipeline takes them as they are when it opens)."""
        middleware = tuple(self._middleware)
        return {name: attrs.evolve(spec, middleware=middleware) for name, spec in self._jobs.items() if spec.handler is not None}

    def uses_asyncio(self) -> bool:
        """Whether a process running this registry's jobs needs an asyncio loop: an ``async def`` handler
        with runtime "asyncio", or a lifespan on a registry whose runtime is "asyncio"."""
        return any(spec.runtime == "asyncio" for spec in self._jobs.values() if spec.handler is not None) or (
            self._lifespan is not None and self.runtime == "asyncio")

    # -- lifespan ---------------------------------------------------------------------------

    def lifespan(self, fn: L) -> L:
        """Decorator: what every handler of a worker process shares, opened once per process before its
        first job and closed at shutdown after its last (Starlette's form)::

            @registry.lifespan
            async def lifespan(config: pipeline.Config):   # or no parameter at all
                pool = await asyncpg.create_pool(...)
                yield {"db": pool}                          # ctx.state in every handler
                await pool.close()

        It runs on the registry's runtime (``Registry(runtime="asyncio")``: as one asyncio task, so
        asyncio libraries work in it). An error while it opens stops the process (its pipeline does not
        open). One per registry. The function is returned unchanged. ``pipeline.engine.lifespan.open_lifespan``
        opens it (open_pipeline does; so does pipeline.testing)."""
        target = inspect.unwrap(fn.func if isinstance(fn, functools.partial) else fn)
        if not inspect.isasyncgenfunction(target):
            raise UsageError(
                f"lifespan {_describe(target)} must be an async generator function: `async def lifespan(config):` "
                "that opens what handlers share, `yield`s it once (handlers see it as ctx.state) and closes it"
            )
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(params) > 1:
            raise UsageError(f"lifespan {_describe(target)} takes at most one parameter (the pipeline's Config), "
                             f"not {len(params)}")
        if self._lifespan is not None:
            raise UsageError(f"this registry already has a lifespan ({_describe(self._lifespan)}): one per registry")
        self._lifespan = fn
        return fn

    def lifespan_function(self) -> Lifespan | None:
        """The function ``@registry.lifespan`` declared, or None."""
        return self._lifespan

    # -- middleware -------------------------------------------------------------------------

    def middleware(self, fn: M) -> M:
        """Add code around every handler call (also a decorator): ``fn(ctx)`` returns an async
        context manager, entered with the job's :class:`JobContext` before its handler runs and
        exited after, for sync and async handlers alike. The first registered is the outermost.
        It sees the handler's exception as it leaves (and a middleware that suppresses it makes
        the attempt succeed); an exception it raises fails the attempt as a handler's would."""
        target = fn.func if isinstance(fn, functools.partial) else fn
        if not callable(fn) or isinstance(fn, type):
            raise TypeError(f"middleware {fn!r} must be a function taking the job's context and returning an async context manager")
        if inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target) or inspect.isgeneratorfunction(target):
            kind = "an async def function" if inspect.iscoroutinefunction(target) else "a generator function"
            raise TypeError(
                f"middleware {_describe(target)} is {kind}: it must return an async context manager; "
                "write it as an async generator that yields once, decorated with @contextlib.asynccontextmanager"
            )
        self._middleware.append(fn)
        return fn

    def _check_payload_class(self, what: str, cls: Any) -> None:
        """Payloads are attrs classes, dataclasses or pydantic v2 models, whose every field has a JSON
        form (payloads.py): the converter structures attrs classes and dataclasses with the same
        strictness (unknown keys refused, arrays only where a sequence is expected), a pydantic model
        validates itself."""
        if not (isinstance(cls, type) and (attrs.has(cls) or dataclasses.is_dataclass(cls) or is_pydantic_model(cls))):
            shown = _describe(cls) if isinstance(cls, type) else repr(cls)
            v1 = "pydantic.v1" in str(getattr(cls, "__module__", "")) or any(
                c.__module__.startswith("pydantic.v1") for c in getattr(cls, "__mro__", ()))
            raise TypeError(
                f"{what}: the payload class {shown} is neither an attrs class nor a dataclass (nor a pydantic v2 model"
                + (": it is a pydantic.v1 one, make it a pydantic.BaseModel" if v1 else "")
                + "); declare it with @attrs.frozen or @dataclasses.dataclass"
            )
        try:
            check_payload(self.converter, cls)
        except Unstorable as exc:
            raise TypeError(f"{what}: the payload class {cls.__qualname__} cannot be stored: {exc}") from None

    def _check_returns(self, name: str, handler: Any, returns: Any) -> Any:
        """The type a result is read back as (None: its JSON form); TypeError if it has no JSON form."""
        if returns in _NO_TYPE or returns is types.NoneType:
            return None
        try:
            check_result(self.converter, returns)
        except Unstorable as exc:
            whose = f"the return annotation of its handler {_describe(handler)}" if handler is not None else "returns="
            raise TypeError(f"job type {name!r}: {whose} is {show(returns)}, which cannot be stored as a result: {exc}; "
                            "or register(..., returns=typing.Any) to read results back as their JSON form") from None
        return returns

    # -- results ------------------------------------------------------------------------------

    def encode_result(self, value: Any) -> str:
        """A handler's return value as the JSON text stored as its job's result (not None: None is no
        result). TypeError or ValueError naming what has no JSON form (and the hook that would give it
        one); RecursionError for a value that refers to itself."""
        return self._to_json(self.converter.unstructure(value))

    def decode_result(self, job_type: str, result: str | None) -> Any:
        """A stored result (JSON text) read back: as its job type's ``returns`` (the handler's return
        annotation) if it has one, else as its JSON form; a result that does not fit that type (stored
        by a handler that returned something else, before its annotation changed) is its JSON form, and
        text that is not JSON is shown as it is."""
        if result is None:
            return None
        try:
            value = json.loads(result)
        except ValueError:
            return result
        spec = self._jobs.get(job_type)
        if spec is None or spec.returns is None or value is None:
            return value
        try:
            return self.converter.structure(value, spec.returns)
        except Exception:  # cattrs' validation groups, TypeError, ValueError: the JSON form, not an error
            return value

    def name_of(self, job: Any) -> str:
        try:
            return self._names_by_cls[type(job)]
        except KeyError:
            raise UnknownJobType(f"{type(job).__name__} is not a registered job type; register it first") from None

    def encode(self, job: Any) -> tuple[str, str]:
        """A job object to (job_type, payload JSON)."""
        name = self.name_of(job)
        return name, self.encode_as(name, job)

    def decode(self, name: str, payload: str | Mapping[str, Any], *, stored: bool = False) -> Any:
        """(job_type, payload) to a job object; UnknownJobType or InvalidPayload when it does not fit.

        ``stored``: a payload read back from the job store, whose size and text were checked
        when it was written (a worker decodes one per job: the check was 2% of the trio thread)."""
        spec = self.spec(name)
        if isinstance(payload, str):
            if not stored:
                self._check_size(payload, f"payload of {name!r}")
            try:
                payload = json.loads(payload)
            except ValueError as exc:
                raise InvalidPayload(f"payload of {name!r} is not valid JSON: {exc}") from None
            except RecursionError:
                raise InvalidPayload(f"payload of {name!r} is nested too deeply to decode") from None
        if type(payload) is not dict:
            if not isinstance(payload, Mapping):
                raise InvalidPayload(f"payload of {name!r} must be a JSON object, got {type(payload).__name__}")
            payload = dict(payload)
        return self._structure(spec.cls, payload, f"payload of {name!r}")

    def validate(self, name: str, payload: str | Mapping[str, Any]) -> str:
        """Check a raw payload against its type; return the canonical JSON to store."""
        return self.encode_as(name, self.decode(name, payload))

    def encode_as(self, name: str, job: Any) -> str:
        try:
            payload = self._to_json(self.converter.unstructure(job))
        except RecursionError:
            raise InvalidPayload(f"payload of {name!r} is nested too deeply (or refers to itself) to store as JSON") from None
        except (TypeError, ValueError, cattrs.BaseValidationError) as exc:
            raise InvalidPayload(f"payload of {name!r} cannot be stored as JSON: {exc}") from None
        self._check_size(payload, f"payload of {name!r}")
        return payload

    def _check_size(self, text: str, what: str) -> None:
        """Refuse text SQLite cannot store (lone surrogates, e.g. from undecodable file names)
        and text over the size limit."""
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidPayload(
                f"{what} contains text that is not valid Unicode (a lone surrogate {text[exc.start]!r} at "
                f"character {exc.start}); decode bytes before putting them in a job"
            ) from None
        if size > self.max_payload_bytes:
            raise InvalidPayload(
                f"{what} is {size:,} bytes of JSON, over the limit of {self.max_payload_bytes:,}; "
                "store large data elsewhere (a file, a row of your own) and put its id in the job"
            )

    def _structure(self, cls: type, data: dict[str, Any], what: str) -> Any:
        try:
            return self.converter.structure(data, cls)
        except cattrs.BaseValidationError as exc:
            details = "; ".join(cattrs.transform_error(exc, path="$", format_exception=_explain))
            raise InvalidPayload(f"{what} does not fit {cls.__name__}: {details}") from None
        except (TypeError, ValueError) as exc:
            raise InvalidPayload(f"{what} does not fit {cls.__name__}: {exc}") from None
        except RecursionError:
            raise InvalidPayload(f"{what} is nested too deeply for {cls.__name__}") from None

    # -- cron schedules -------------------------------------------------------------------------

    def schedule(self, name: str, cron: str, job: Any, *, timezone: str = "UTC") -> Schedule:
        """Declare a cron schedule: ``job`` (an object of a registered type) is enqueued at each
        tick of ``cron`` (5 fields, or 6 with seconds first) read in ``timezone`` (an IANA name).
        ``open_pipeline`` writes the declared schedules to the store at start, and disables the
        ones declared before that the code no longer declares. Checked here: UsageError,
        UnknownJobType or InvalidPayload naming what is wrong."""
        if name in self._schedules:
            raise ValueError(f"schedule {name!r} is already declared")
        job_type, payload = self.encode(job)
        declared = make_schedule(self, name, cron, job_type, payload, timezone)
        self._schedules[name] = declared
        return declared

    def schedules(self) -> list[Schedule]:
        return [self._schedules[name] for name in sorted(self._schedules)]

    # -- resources --------------------------------------------------------------------------

    def add_resource(self, name: str, factory: ResourceFactory) -> None:
        """Declare a resource handlers share (an HTTP client, a cache connection).

        ``factory(config, registry)`` returns an async context manager; ``open_pipeline``
        enters it before any actor starts and exits it after the last one stopped. Handlers
        reach the value as ``ctx.resources[name]``.
        """
        self._resources[name] = factory

    def resources(self) -> dict[str, ResourceFactory]:
        return dict(self._resources)

    # -- events ---------------------------------------------------------------------------

    def add_event(self, name: str, cls: type, route: Route) -> None:
        self._check_payload_class(f"event {name!r}", cls)
        self._events[name] = EventSpec(name, cls, route)
        self._event_names_by_cls[cls] = name

    def event_names(self) -> list[str]:
        return sorted(self._events)

    def event_spec(self, name: str) -> EventSpec:
        try:
            return self._events[name]
        except KeyError:
            known = ", ".join(sorted(self._events)) or "none"
            raise UnknownEvent(f"unknown event {_clip(name)!r} (known: {known})") from None

    def event_name_of(self, event: Any) -> str:
        try:
            return self._event_names_by_cls[type(event)]
        except KeyError:
            raise UnknownEvent(f"{type(event).__name__} is not a registered event") from None

    def decode_event(self, name: str, data: Any) -> Any:
        spec = self.event_spec(name)
        if not isinstance(data, Mapping):
            raise InvalidPayload(f"data of event {name!r} must be a JSON object, got {type(data).__name__}")
        try:
            text = json.dumps(data, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidPayload(f"data of event {name!r} is not JSON: {exc!r}") from None
        self._check_size(text, f"data of event {name!r}")
        return self._structure(spec.cls, dict(data), f"data of event {name!r}")

    def route(self, event: Any, config: Config) -> list[Routed]:
        return self.event_spec(self.event_name_of(event)).route(event, config)


def _check_runtime(runtime: Any, what: str) -> str:
    if runtime not in RUNTIMES:
        raise UsageError(f"{what} must be one of {', '.join(map(repr, RUNTIMES))} (what an `async def` handler runs on; "
                         f"a plain `def` runs in a thread), got {runtime!r:.60}")
    return str(runtime)


_NO_TYPE = (None, type(None), Any, object, typing.NoReturn, typing.Never)  # a result read back as its JSON form


def _return_annotation(handler: Any) -> Any:
    """A handler's return annotation, resolved as :func:`_payload_class` resolves its first parameter's;
    None if it has none, or one that cannot be resolved (a name under ``if TYPE_CHECKING:``): the
    result is then read back as its JSON form (``register(returns=...)`` says otherwise)."""
    target = inspect.unwrap(handler.func if isinstance(handler, functools.partial) else handler)
    if not inspect.isroutine(target) and not isinstance(target, type):
        target = type(target).__call__
    try:
        annotation = inspect.signature(target).return_annotation
    except (TypeError, ValueError):
        return None
    if annotation is inspect.Signature.empty:
        return None
    try:
        return typing.get_type_hints(_Annotations({"return": annotation}), globalns=getattr(target, "__globals__", None),
                                     include_extras=True)["return"]
    except Exception:  # NameError above all
        return None


def _check_handler(name: str, handler: Any) -> bool:
    """Whether the handler runs in a thread (a plain callable), or as a coroutine (False).
    Refused at registration, since calling them could never run a job: a class, an async
    generator, a generator, what is not callable. Async: an ``async def`` function or method,
    an object whose ``__call__`` is ``async def``, ``functools.partial`` of either (or a
    function marked with ``inspect.markcoroutinefunction``). Anything else callable is sync;
    one that turns out to return an awaitable (a lambda around a coroutine function) fails its
    job at once, saying so (see pools.py): that cannot be told without calling it."""
    target = handler
    while isinstance(target, functools.partial):
        target = target.func
    call = target
    if callable(target) and not inspect.isroutine(target) and not isinstance(target, type):
        call = type(target).__call__  # an instance: what runs is its class's __call__
    if inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(inspect.unwrap(call)):
        return False  # (unwrapped: a functools.wraps decorator's plain wrapper returns the coroutine)
    if not callable(handler):
        what = f"is not callable (got {type(handler).__name__})"
    elif isinstance(target, type):
        what = f"is a class ({target.__qualname__}): register a function, or an instance whose __call__ runs the job"
    elif inspect.isasyncgenfunction(call):
        what = f"{_describe(call)} is an async generator function (it yields): a handler returns, it does not yield"
    elif inspect.isgeneratorfunction(call):
        what = f"{_describe(call)} is a generator function (it yields, so calling it would run nothing)"
    else:
        return True
    raise TypeError(
        f"job type {name!r}: handler {what}; a handler is an `async def` function taking (job, ctx), "
        "or a plain `def` one, which runs in a thread"
    )


def _payload_class(fn: Any) -> Any:
    """The annotation of a handler's first parameter, resolved as typing.get_type_hints does
    (so a module with ``from __future__ import annotations`` works); only that one is resolved,
    so ``ctx: JobContext`` imported under ``if TYPE_CHECKING:`` does not matter."""
    described = _describe(fn.func if isinstance(fn, functools.partial) else fn)
    example = f"`def {getattr(fn, '__name__', 'handler')}(job: MyPayload, ctx: pipeline.JobContext)`"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise TypeError(f"handler {described} takes no job parameter: a handler takes (job, ctx), as {example}")
    first = params[0]
    if first.annotation is inspect.Parameter.empty:
        raise TypeError(
            f"handler {described}: its first parameter {first.name!r} has no annotation, so the payload class is "
            f"unknown; annotate it with the payload class (an attrs class or a dataclass), as {example}, "
            "or use registry.register(name, cls, handler)"
        )
    target = inspect.unwrap(fn.func if isinstance(fn, functools.partial) else fn)
    if not inspect.isroutine(target) and not isinstance(target, type):
        target = type(target).__call__
    holder = _Annotations({first.name: first.annotation})
    try:
        return typing.get_type_hints(holder, globalns=getattr(target, "__globals__", None))[first.name]
    except Exception as exc:  # NameError above all: the name is not defined where the handler is
        raise TypeError(
            f"handler {described}: the annotation {first.annotation!r} of its first parameter {first.name!r} "
            f"cannot be resolved ({type(exc).__name__}: {exc}); define the payload class at module level, "
            "before the handler and not under `if TYPE_CHECKING:`, or use registry.register(name, cls, handler)"
        ) from None


class _Annotations:
    """One parameter's annotation, for typing.get_type_hints to resolve by itself."""

    def __init__(self, annotations: dict[str, Any]) -> None:
        self.__annotations__ = annotations


def _describe(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


def _clip(name: str, limit: int = 80) -> str:
    """A name from a caller, short enough to echo: a 1 MB job type is not repeated back whole."""
    return name if len(name) <= limit else name[:limit] + "…"
