"""The admin HTTP API: JSON endpoints over the job store (DESIGN 7, issue 4).

Every read and write goes through the pipeline's job backend, like the actors' own.
Errors are ``{"error": {"code", "message"}}``. 400 is a request that cannot be read as asked; 422 a
JSON body that was read and does not fit (what FastAPI and Starlette users expect):

    400 bad_request        a malformed or unknown query parameter; a body that is not JSON (or not
                           UTF-8 text), or none where one is required; no Host header, or one that is
                           not name[:port]; a signal's name that is none (empty, too long)
    401 unauthorized       ADMIN_TOKEN is set and the request's Bearer token is missing or wrong
    403 forbidden          a cross-origin write, or a foreign Host header on a token-less server
    404 not_found          no such job, batch, schedule or job type (or route)
    408 request_timeout    the declared body did not arrive within BODY_TIMEOUT
    409 conflict           retry of a job that is neither dead nor cancelled, or whose unique key
                           another job holds; cancel of a finished job; delete of a running job;
                           a schedule name in use; a signal to a finished job
    410 gone               a signed link used already, or expired (link_page.py)
    413 payload_too_large  body over ADMIN_MAX_BODY_BYTES
    415 unsupported_media_type  a POST without Content-Type: application/json
    422 invalid            a JSON body that does not fit: not an object, a field unknown, missing or
                           out of range, an unknown job type or event, a payload that does not fit its
                           class, an expires_at that is not a time to come, an unknown parent job in
                           after, a schedule's bad name, cron expression or time zone, a bulk action's
                           filter it does not take, a retry's from_step the job has no step of, a
                           signal's payload too big
    503 unavailable        the database refused, or the pipeline is shutting down

Every message goes out through ``error_response``, which clips what the client sent wherever the
message echoes it (``inputs.clip_echoes``): the endpoints and the engine's checks write ``{value!r}``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import control
from ..backends import JobRecord
from ..backends.base import CANCELLING, LIST_ORDERS, PRIORITY_MAX, PRIORITY_MIN, ScheduleRecord
from ..durable import check_signal_name, encode_signal_payload
from ..errors import PipelineClosed, PipelineError, StoreError, UsageError
from ..requests import prepare_rows
from ..schedules import make_schedule
from ..states import TERMINAL, Status
from . import inputs
from .metrics import CONTENT_TYPE, Metrics

if TYPE_CHECKING:
    from ..engine.wiring import Pipeline

log = logging.getLogger("pipeline.admin")

MAX_PER_PAGE = 200
DEFAULT_PER_PAGE = 50
MAX_PAGE = 10_000_000  # page × per_page stays far inside SQLite's 64-bit OFFSET
MAX_OFFSET = MAX_PAGE * MAX_PER_PAGE  # a batch's jobs are paged by limit and offset
STATS_REUSE_FACTOR = 4.0  # stats are reused for this many times as long as they took to compute
BODY_TIMEOUT = 10.0  # seconds a request's whole body may take to arrive: a client that declares one and
# never sends it must not hold a connection (and a task) for ever; read when each body is read

NO_BODY = object()  # an optional body that was not sent (unlike a JSON null, which is refused)
CANCEL_REASON = "by an operator through the admin API"  # in the error of a job cancelled here
FILTER_FIELDS = ("status", "job_type")  # a bulk action's body

CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    410: "gone",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid",
    500: "internal",
    503: "unavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def error_response(status: int, message: str, headers: dict[str, str] | None = None, *,
                   sent: Iterable[str] = ()) -> JSONResponse:
    """The error answer; ``sent``: the strings of the request, clipped wherever ``message`` echoes them."""
    message = inputs.clip_echoes(message, sent)
    return JSONResponse({"error": {"code": CODES.get(status, "error"), "message": message}}, status, headers=headers)


def _sent(request: Request) -> Iterator[str]:
    """What the client sent that a message may echo: path and query parameters, the body's strings."""
    yield from request.path_params.values()
    for key, value in request.query_params.multi_items():
        yield key
        yield value
    body = getattr(request.state, "body", NO_BODY)  # set by AdminApi._body once it parsed the body
    if body is not NO_BODY:
        yield from inputs.strings_in(body)


Endpoint = Callable[[Request], Awaitable[Response]]


def _answers_errors(fn: Endpoint, query: tuple[str, ...] = ()) -> Endpoint:
    """Turn the pipeline's exceptions into the API's error responses; refuse query
    parameters the endpoint does not know (``?statu=dead`` must not list everything)."""

    async def endpoint(request: Request) -> Response:
        try:
            unknown = [key for key in request.query_params if key not in query]
            if unknown:
                expected = f"; expected {', '.join(query)}" if query else "; this endpoint takes none"
                raise ApiError(400, f"unknown query parameter {unknown[0]!r}{expected}")
            return await fn(request)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers, sent=_sent(request))
        except UsageError as exc:
            return error_response(422, str(exc), sent=_sent(request))
        except PipelineClosed as exc:
            return error_response(503, str(exc))
        except StoreError as exc:
            return error_response(503, str(exc))

    endpoint.__name__ = fn.__name__
    endpoint.__doc__ = fn.__doc__
    return endpoint


class AdminApi:
    """The endpoints of one pipeline's admin API."""

    def __init__(self, pipeline: Pipeline, metrics: Metrics) -> None:
        self.pipeline = pipeline
        self.backend = pipeline.backend
        self.metrics = metrics
        self.max_body = pipeline.config.admin.max_body_bytes
        self._stats_lock = trio.Lock()
        self._stats_cache: tuple[float, dict[str, Any]] | None = None  # (reuse until, stats); trio thread only
        self._stats_generation = 0  # bumped by every write through this API

    def routes(self) -> list[tuple[str, str, Endpoint]]:
        """(method, path, endpoint); the order matters where paths overlap."""
        e = _answers_errors
        return [
            ("GET", "/healthz", e(self.healthz)),
            ("GET", "/metrics", e(self.metrics_text)),
            ("GET", "/admin/jobs", e(self.list_jobs, ("status", "job_type", "page", "per_page", "priority", "order"))),
            ("POST", "/admin/jobs", e(self.create_job)),
            ("POST", "/admin/jobs/cleanup", e(self.cleanup)),
            ("POST", "/admin/jobs/cancel", e(self.bulk_cancel)),
            ("POST", "/admin/jobs/retry", e(self.bulk_retry)),
            ("POST", "/admin/jobs/delete", e(self.bulk_delete)),
            ("GET", "/admin/jobs/{job_id}", e(self.get_job)),
            ("DELETE", "/admin/jobs/{job_id}", e(self.delete_job)),
            ("POST", "/admin/jobs/{job_id}/retry", e(self.retry_job)),
            ("POST", "/admin/jobs/{job_id}/cancel", e(self.cancel_job)),
            ("POST", "/admin/jobs/{job_id}/signals/{name}", e(self.signal_job)),
            ("GET", "/admin/types", e(self.list_types)),
            ("POST", "/admin/types/{name}/pause", e(self.pause_type)),
            ("POST", "/admin/types/{name}/resume", e(self.resume_type)),
            ("POST", "/admin/batches", e(self.create_batch)),
            ("GET", "/admin/batches/{batch_id}", e(self.get_batch, ("limit", "offset"))),
            ("POST", "/admin/events", e(self.emit_event)),
            ("GET", "/admin/stats", e(self.stats)),
            ("GET", "/admin/workers", e(self.workers)),
            ("GET", "/admin/schedules", e(self.list_schedules)),
            ("POST", "/admin/schedules", e(self.create_schedule)),
            ("DELETE", "/admin/schedules/{name}", e(self.remove_schedule)),
            ("POST", "/admin/schedules/{name}/pause", e(self.pause_schedule)),
            ("POST", "/admin/schedules/{name}/resume", e(self.resume_schedule)),
        ]

    # -- jobs ------------------------------------------------------------------------------

    async def list_jobs(self, request: Request) -> Response:
        """GET /admin/jobs?status=&job_type=&priority=&order=&page=&per_page= — newest first, or in claim order."""
        params = request.query_params
        status = params.get("status")
        if status is not None and status not in set(Status):
            raise ApiError(400, f"status must be one of {', '.join(Status)}, got {status!r}")
        job_type = params.get("job_type")
        if job_type == "":
            raise ApiError(400, "job_type must not be empty (leave it out to list every type)")
        page = _int_param(params.get("page"), "page", 1, 1, MAX_PAGE)
        per_page = _int_param(params.get("per_page"), "per_page", DEFAULT_PER_PAGE, 1, MAX_PER_PAGE)
        given = params.get("priority")
        priority = None if given is None else _signed_param(given, "priority", PRIORITY_MIN, PRIORITY_MAX)
        order = params.get("order", "newest")
        if order not in LIST_ORDERS:
            raise ApiError(400, f"order must be one of {', '.join(LIST_ORDERS)}, got {order!r}")
        if job_type is not None and not inputs.storable(job_type):  # no type is named so (and Postgres refuses the question)
            return JSONResponse({"items": [], "total": 0, "page": page, "per_page": per_page})
        records, total = await self.backend.list(status=status, job_type=job_type, limit=per_page, offset=(page - 1) * per_page,
                                                 priority=priority, order=order)
        return JSONResponse({"items": [r.to_json() for r in records], "total": total, "page": page, "per_page": per_page})

    async def get_job(self, request: Request) -> Response:
        """GET /admin/jobs/{id}"""
        return JSONResponse((await self._job(request.path_params["job_id"])).to_json())

    async def retry_job(self, request: Request) -> Response:
        """POST /admin/jobs/{id}/retry — dead or cancelled → pending, attempts reset, due now. Optional body
        ``{"from_step": NAME}`` (a replay, docs/durable.md): a dead, cancelled or completed job runs again with
        that step and every step after it forgotten; 422 naming its steps if it has none of that name."""
        job_id = request.path_params["job_id"]
        body = await self._body(request, required=False)
        from_step = None
        if body is not NO_BODY:
            body = inputs.object_of(body, "the request body")
            unknown = [k for k in body if k != "from_step"]
            if unknown:
                raise UsageError(f"the request body: unknown field {inputs.clip(unknown[0])!r}; expected from_step")
            from_step = body.get("from_step")
            if from_step is not None and (type(from_step) is not str or not from_step):
                raise UsageError("the request body: from_step must be a step's name (a non-empty string)"
                                 + ("" if from_step is None else f", got {inputs.kind(from_step)}"))
        was = await self._job(job_id)
        if from_step is not None:
            names = [step.name for step in was.steps]
            if from_step not in names:  # (the store says so too; asked first so that it is a 422, not a 409)
                raise UsageError(f"job {job_id} has no step named {from_step!r}; its steps: "
                                 + (", ".join(repr(n) for n in names) if names else "none"))
        try:
            record = await self.backend.revive(job_id, from_step=from_step)
        except LookupError:  # deleted meanwhile
            raise ApiError(404, f"no job with id {job_id!r}") from None
        except UsageError as exc:  # not dead or cancelled (or completed, for a replay), or its unique key is held
            raise ApiError(409, str(exc)) from None
        log.info("admin: job %s retried (%s → pending)%s", job_id, was.status,
                 "" if from_step is None else f" from its step {from_step!r}")
        self._forget_stats()
        return JSONResponse(record.to_json())

    async def signal_job(self, request: Request) -> Response:
        """POST /admin/jobs/{id}/signals/{name} — send the signal ``name``; the body is its payload (any JSON
        value; empty: none) → {"outcome": "woken" | "kept", "job"}: woken, the job was suspended waiting for it
        and is pending now; kept, the job takes it when it reaches its wait. 404 unknown job, 409 finished job,
        400 a body that is not JSON or a name that is none, 422 a payload too big."""
        job_id, name = request.path_params["job_id"], request.path_params["name"]
        try:
            check_signal_name(name)
        except UsageError as exc:
            raise ApiError(400, str(exc)) from None
        body = await self._body(request, required=False)
        payload = None if body is NO_BODY else body
        encode_signal_payload(payload)  # a UsageError (too big) is a 422, before the job is looked up
        await self._job(job_id)
        try:
            outcome = await self.pipeline.signal(job_id, name, payload)
        except LookupError:  # deleted meanwhile
            raise ApiError(404, f"no job with id {job_id!r}") from None
        except UsageError as exc:  # it finished (signal_refused's text)
            raise ApiError(409, str(exc)) from None
        log.info("admin: signal %r sent to job %s (%s)", name, job_id, outcome)
        self._forget_stats()
        return JSONResponse({"outcome": outcome, "job": (await self._job(job_id)).to_json()})

    async def cancel_job(self, request: Request) -> Response:
        """POST /admin/jobs/{id}/cancel — a pending, waiting or suspended job is cancelled at once (a waiting
        one's own waiting children with it); a running one is asked to stop (``cancel_requested``; its worker
        cancels its handler and ends it cancelled). The job as it is then; 409 once it has finished
        (completed, dead or cancelled)."""
        job_id = request.path_params["job_id"]
        was = await self._job(job_id)
        if was.status in TERMINAL:
            raise ApiError(409, f"job {job_id} is {was.status}: only waiting, pending, suspended or running jobs can be cancelled")
        (answer,) = await self.backend.cancel([job_id], reason=CANCEL_REASON)
        if answer is None:  # deleted meanwhile
            raise ApiError(404, f"no job with id {job_id!r}")
        if answer not in (Status.CANCELLED, CANCELLING):  # it finished meanwhile
            raise ApiError(409, f"job {job_id} is {answer}: it finished before the cancel")
        log.info("admin: job %s %s", job_id, "cancelled" if answer == Status.CANCELLED else "running: cancel requested")
        self._forget_stats()
        return JSONResponse((await self._job(job_id)).to_json())

    async def bulk_cancel(self, request: Request) -> Response:
        """POST /admin/jobs/cancel — {"status"?: "waiting" | "pending" | "running", "job_type"?} → the counts."""
        return await self._bulk(request, "cancel")

    async def bulk_retry(self, request: Request) -> Response:
        """POST /admin/jobs/retry — {"status"?: "dead" | "cancelled", "job_type"?} → the counts."""
        return await self._bulk(request, "retry")

    async def bulk_delete(self, request: Request) -> Response:
        """POST /admin/jobs/delete — {"status", "job_type"?} (any status but running) → the counts."""
        return await self._bulk(request, "delete")

    async def _bulk(self, request: Request, action: str) -> Response:
        """Every job the body's filter matches, in batches (``control.bulk``); 422 for a filter the
        action does not take."""
        body = inputs.object_of(await self._body(request, required=True), "the request body")
        unknown = [k for k in body if k not in FILTER_FIELDS]
        if unknown:
            raise UsageError(f"the request body: unknown field {inputs.clip(unknown[0])!r}; expected {', '.join(FILTER_FIELDS)}")
        nulls = [k for k in FILTER_FIELDS if k in body and body[k] is None]
        if nulls:
            raise UsageError(f"the request body: {nulls[0]} must be a string, got null (leave it out for any)")
        job_filter = control.JobFilter.checked(action, body.get("status"), body.get("job_type"))
        try:
            outcome = await control.bulk(self.backend, job_filter, reason=CANCEL_REASON)
        finally:
            self._forget_stats()
        log.info("admin: %s", outcome.text())
        return JSONResponse(outcome.to_json())

    async def delete_job(self, request: Request) -> Response:
        """DELETE /admin/jobs/{id} — 204; 409 while it runs."""
        job_id = request.path_params["job_id"]
        await self._job(job_id)
        try:
            await self.backend.delete(job_id)
        except LookupError:  # deleted meanwhile
            raise ApiError(404, f"no job with id {job_id!r}") from None
        except UsageError as exc:  # running
            raise ApiError(409, str(exc)) from None
        log.info("admin: job %s deleted", job_id)
        self._forget_stats()
        return Response(status_code=204)

    async def cleanup(self, request: Request) -> Response:
        """POST /admin/jobs/cleanup — body (optional): {"statuses": [...], "older_than_seconds": n}."""
        body = await self._body(request, required=False)
        body = {} if body is NO_BODY else inputs.object_of(body, "the request body")
        unknown = [k for k in body if k not in ("statuses", "older_than_seconds")]
        if unknown:
            raise UsageError(f"unknown field {unknown[0]!r}; expected statuses, older_than_seconds")
        statuses = body.get("statuses", ["completed", "dead"])
        if not isinstance(statuses, list) or not statuses or not all(isinstance(s, str) and s in TERMINAL for s in statuses):
            raise UsageError(f"statuses must be a non-empty array of \"completed\", \"dead\" and \"cancelled\", got {statuses!r}")
        older = body.get("older_than_seconds")
        if older is not None:
            older = inputs.seconds(older, "older_than_seconds")
        deleted = await self.backend.cleanup(statuses=tuple(dict.fromkeys(statuses)), older_than_seconds=older)
        self._forget_stats()
        log.info("admin: cleanup deleted %d %s jobs%s", deleted, "/".join(statuses),
                 "" if older is None else f" older than {older:g} s")
        return JSONResponse({"deleted": deleted})

    async def create_job(self, request: Request) -> Response:
        """POST /admin/jobs — {"job_type", "payload", "priority"?, "max_attempts"?, "run_after"?,
        "unique_key"?, "expires_at"?, "unique_while"?, "after"?, "on_parent_failure"?, "idempotency_key"?} → 201
        with the new job (``waiting`` when it has parents that have not completed); 200 with the job that holds
        the unique key, or that the idempotency key named (a duplicate: nothing inserted), ``duplicate`` saying
        which; 200 {"id", "duplicate": true} when the idempotency key names a job removed since (the key
        outlives its job for its window). 422 naming an unknown parent (nothing inserted)."""
        request_ = inputs.job_request(await self._body(request, required=True), "the request body")
        rows = prepare_rows(self.pipeline.registry, [request_], default_max_attempts=self.pipeline.config.worker.default_max_attempts)
        rows = [row._replace(idempotency_seconds=self.pipeline.config.retention.idempotency_seconds) for row in rows]
        (job_id,) = await self.backend.insert(rows)
        duplicate = job_id != rows[0].id
        if not duplicate:
            self._forget_stats()
        record = await self.backend.get(job_id)
        # (None: a key's job removed by retention or an operator; a retry must not read a 404 as a failure)
        answer = {"id": job_id} if record is None else record.to_json()
        return JSONResponse({**answer, "duplicate": duplicate}, 200 if duplicate else 201,
                            headers={"Location": f"/admin/jobs/{job_id}"})

    # -- batches ----------------------------------------------------------------------------

    async def create_batch(self, request: Request) -> Response:
        """POST /admin/batches — {"jobs": [job, ...], "then"?: job} → 201 {"id", "job_ids", "callback_id"}:
        the jobs and the callback in one transaction, as ``enqueue_batch`` inserts them; the callback
        runs once every job of the batch has ended. 422 naming what does not fit (nothing inserted)."""
        asked = inputs.batch_request(await self._body(request, required=True), "the request body")
        rows, batch = inputs.batch_rows(self.pipeline.registry, asked,
                                        default_max_attempts=self.pipeline.config.worker.default_max_attempts)
        ids = await self.backend.insert(rows, batch=batch)
        self._forget_stats()
        log.info("admin: batch %s enqueued (%d jobs%s)", batch.id, len(asked.jobs),
                 "" if batch.callback_id is None else f", callback {batch.callback_id}")
        return JSONResponse({"id": batch.id, "job_ids": ids[:len(asked.jobs)], "callback_id": batch.callback_id}, 201,
                            headers={"Location": f"/admin/batches/{batch.id}"})

    async def get_batch(self, request: Request) -> Response:
        """GET /admin/batches/{id}?limit=&offset= — the batch's jobs counted by status, its callback's
        status, and a page of its jobs in the order they were enqueued; 404 if unknown."""
        batch_id = request.path_params["batch_id"]
        _findable(batch_id, f"no batch with id {batch_id!r}")
        params = request.query_params
        limit = _int_param(params.get("limit"), "limit", DEFAULT_PER_PAGE, 1, MAX_PER_PAGE)
        offset = _int_param(params.get("offset"), "offset", 0, 0, MAX_OFFSET)
        view = await control.batch_view(self.backend, batch_id, limit=limit, offset=offset)
        if view is None:
            raise ApiError(404, f"no batch with id {batch_id!r}")
        return JSONResponse(view.to_json())

    async def emit_event(self, request: Request) -> Response:
        """POST /admin/events — {"event": "UserRegistered", "data": {...}} → 201 {"job_ids": [...]}."""
        event_request = inputs.event_request(await self._body(request, required=True), "the request body")
        event = self.pipeline.registry.decode_event(event_request.event, event_request.data)
        try:
            job_ids = await self.pipeline.emit(event)
            self._forget_stats()
        except (UsageError, PipelineClosed, StoreError):
            raise
        except PipelineError as exc:  # a route function failed: a bug in the application's routing
            log.error("admin: routing event %s failed: %s", event_request.event, exc)
            raise ApiError(500, f"routing event {event_request.event} failed: {exc}") from None
        return JSONResponse({"job_ids": job_ids}, 201)

    # -- cron schedules ----------------------------------------------------------------------

    async def list_schedules(self, request: Request) -> Response:
        """GET /admin/schedules — every schedule, by name, with its next run."""
        return JSONResponse({"schedules": [s.to_json() for s in await self.backend.schedules()]})

    async def create_schedule(self, request: Request) -> Response:
        """POST /admin/schedules — {"name", "cron", "job_type", "payload"?, "timezone"?} → 201; 422 naming
        what does not fit (name, cron, time zone, job type, payload); 409 if the name is in use."""
        asked = inputs.schedule_request(await self._body(request, required=True), "the request body")
        # a UsageError (UnknownJobType and InvalidPayload too) is a 422 naming what does not fit
        schedule = make_schedule(self.pipeline.registry, asked.name, asked.cron, asked.job_type, asked.payload, asked.timezone)
        record = ScheduleRecord.of(schedule, origin="operator")
        try:
            added = await self.backend.put_schedule(record)
        except UsageError as exc:  # the name is in use
            raise ApiError(409, str(exc)) from None
        log.info("admin: schedule %s added (%s at %r %s)", added.name, added.job_type, added.cron, added.timezone)
        return JSONResponse(added.to_json(), 201, headers={"Location": f"/admin/schedules/{added.name}"})

    async def remove_schedule(self, request: Request) -> Response:
        """DELETE /admin/schedules/{name} — 204."""
        name = _findable(request.path_params["name"], f"no schedule named {request.path_params['name']!r}")
        try:
            await self.backend.remove_schedule(name)
        except LookupError:
            raise ApiError(404, f"no schedule named {name!r}") from None
        log.info("admin: schedule %s removed", name)
        return Response(status_code=204)

    async def pause_schedule(self, request: Request) -> Response:
        """POST /admin/schedules/{name}/pause"""
        return await self._schedule_enabled(request.path_params["name"], False)

    async def resume_schedule(self, request: Request) -> Response:
        """POST /admin/schedules/{name}/resume — fires again from its first tick after now."""
        return await self._schedule_enabled(request.path_params["name"], True)

    async def _schedule_enabled(self, name: str, enabled: bool) -> Response:
        _findable(name, f"no schedule named {name!r}")
        try:
            changed = await self.backend.set_schedule_enabled(name, enabled)
        except LookupError:
            raise ApiError(404, f"no schedule named {name!r}") from None
        log.info("admin: schedule %s %s", name, "resumed" if enabled else "paused")
        return JSONResponse(changed.to_json())

    # -- job types ---------------------------------------------------------------------------

    async def list_types(self, request: Request) -> Response:
        """GET /admin/types — every job type: paused or not, its limits, its jobs by status."""
        summaries = await control.types_summary(self.backend, self.pipeline.registry, self.pipeline.config,
                                                stats=await self._stats())
        return JSONResponse({"types": [t.to_json() for t in summaries]})

    async def pause_type(self, request: Request) -> Response:
        """POST /admin/types/{name}/pause — no new job of the type starts, in any process on the store."""
        return await self._type_paused(request.path_params["name"], True)

    async def resume_type(self, request: Request) -> Response:
        """POST /admin/types/{name}/resume"""
        return await self._type_paused(request.path_params["name"], False)

    async def _type_paused(self, name: str, paused: bool) -> Response:
        _findable(name, f"no job type named {name!r}")
        try:
            await control.set_paused(self.backend, self.pipeline.registry, name, paused)
        except LookupError as exc:
            raise ApiError(404, str(exc)) from None
        log.info("admin: job type %s %s", name, "paused" if paused else "resumed")
        summaries = await control.types_summary(self.backend, self.pipeline.registry, self.pipeline.config,
                                                stats=await self._stats())
        found = next((t for t in summaries if t.name == name), None)
        if found is None:  # a type the registry left, resumed, of which the store holds no job
            found = control.TypeSummary(name, paused, False, None, None, None, {s.value: 0 for s in Status})
        return JSONResponse(found.to_json())

    # -- overview ----------------------------------------------------------------------------

    async def stats(self, request: Request) -> Response:
        """GET /admin/stats"""
        return JSONResponse(await self._stats())

    async def workers(self, request: Request) -> Response:
        """GET /admin/workers"""
        return JSONResponse({"workers": [worker.to_json() for worker in await self.backend.workers()]})

    async def healthz(self, request: Request) -> Response:
        """GET /healthz — 200 while the database answers and the pipeline takes work: 503
        naming the reasons while the store cannot commit or the Poller cannot claim (under a
        supervisor: while any worker process cannot, or none runs). ``workers``: how many
        processes run jobs behind this API (this one: 1 or 0; a supervisor: its worker processes)."""
        await self.backend.ping()
        if self.pipeline.closed:
            raise ApiError(503, "the pipeline is shutting down")
        reasons = self.pipeline.health.reasons(trio.current_time())
        trouble = self.backend.trouble()
        if trouble:
            reasons.insert(0, trouble)
        if reasons:
            raise ApiError(503, "; ".join(reasons))
        processes = self.pipeline.worker_processes
        workers = processes() if processes is not None else int(self.pipeline.config.worker.enabled)
        return JSONResponse({"status": "ok", "workers": workers})

    async def metrics_text(self, request: Request) -> Response:
        """GET /metrics — Prometheus text format."""
        text = self.metrics.render(await self._stats(), self.backend.counters(),
                                   self.pipeline.global_limits, paused=await self.backend.paused_types())
        return Response(text, media_type=CONTENT_TYPE)

    # -- helpers ---------------------------------------------------------------------------

    async def _stats(self) -> dict[str, Any]:
        """The store's numbers, shared by every dashboard and scraper for a while: the
        counts scan the table (about a second at a million rows), so a result is reused
        for four times as long as it took to compute (microseconds on small stores)."""
        async with self._stats_lock:  # one computation at a time; the others reuse it
            if self._stats_cache is not None and trio.current_time() < self._stats_cache[0]:
                return self._stats_cache[1]
            started, generation = trio.current_time(), self._stats_generation
            stats = await self.backend.stats()
            finished = trio.current_time()
            if generation == self._stats_generation:  # no write through this API meanwhile
                self._stats_cache = (finished + STATS_REUSE_FACTOR * (finished - started), stats)
            return stats

    def _forget_stats(self) -> None:
        """After a write through this API, the next view must show it."""
        self._stats_cache = None
        self._stats_generation += 1

    async def _job(self, job_id: str) -> JobRecord:
        _findable(job_id, f"no job with id {job_id!r}")
        record = await self.backend.get(job_id)
        if record is None:
            raise ApiError(404, f"no job with id {job_id!r}")
        return record

    async def _body(self, request: Request, *, required: bool) -> Any:
        """The JSON body, read up to ADMIN_MAX_BODY_BYTES (413 beyond) within BODY_TIMEOUT
        (408 after); NO_BODY if empty and optional."""
        chunks, size = [], 0
        with trio.move_on_after(BODY_TIMEOUT) as waited:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    raise ApiError(413, f"request body is larger than {self.max_body} bytes (ADMIN_MAX_BODY_BYTES)")
                chunks.append(chunk)
        if waited.cancelled_caught:
            raise ApiError(408, f"the request body did not arrive within {BODY_TIMEOUT:g} s", headers={"Connection": "close"})
        raw = b"".join(chunks)
        if not raw:  # (whitespace alone is not JSON: 400 below)
            if required:
                raise ApiError(400, "a JSON body is required")
            return NO_BODY
        try:
            request.state.body = body = inputs.loads(raw, "the request body")
        except UsageError as exc:
            raise ApiError(400, str(exc)) from None
        return body


def _findable(text: str, missing: str) -> str:
    """An id or a name from the path, as a store can hold it; else 404 with ``missing``. Text with a NUL
    or a lone surrogate names nothing in any store, and Postgres refuses to be asked about it (a
    DataError, which answered 503 "database unavailable" before issue 32)."""
    if not inputs.storable(text):
        raise ApiError(404, missing)
    return text


def _int_param(text: str | None, name: str, default: int, lo: int, hi: int) -> int:
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise ApiError(400, f"{name} must be an integer from {lo} to {hi}, got {text!r}")
    value = int(text)
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must be an integer from {lo} to {hi}, got {value}")
    return value


def _signed_param(text: str, name: str, lo: int, hi: int) -> int:
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 12:
        raise ApiError(400, f"{name} must be an integer from {lo} to {hi}, got {text!r}")
    value = int(text)
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must be an integer from {lo} to {hi}, got {value}")
    return value

