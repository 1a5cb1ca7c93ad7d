"""The admin API's OpenAPI 3.0 document, served at ``/openapi.json``.

Written out rather than derived: it is the contract that the schemathesis fuzz test
holds the server to (every status code, content type and response body it can send).
Job types and events are enumerated from the pipeline's registry, so a client sees
what this process accepts.
"""

from __future__ import annotations

from typing import Any

from ..backends.base import LIST_ORDERS, MAX_LISTED_RELATIVES, ON_PARENT_FAILURE, PRIORITY_MAX, PRIORITY_MIN, STEP_STATUSES
from ..durable import MAX_SIGNAL_NAME_CHARS
from ..control import ACTIONS, DONE
from ..registry import Registry
from ..requests import MAX_UNIQUE_KEY_CHARS
from ..states import Status
from ..workflows import MAX_PARENTS
from .api import CODES, DEFAULT_PER_PAGE, MAX_OFFSET, MAX_PAGE, MAX_PER_PAGE
from .inputs import BATCH_JOB_FIELDS, CALLBACK_FIELDS, INT32_MAX, MAX_OLDER_THAN_SECONDS

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref("Error")}}}


_ERRORS = {
    400: "The request cannot be read as asked: a malformed or unknown query parameter, a body that is not JSON "
         "(or none where one is required), a missing or malformed Host header.",
    401: "ADMIN_TOKEN is set and the Bearer token is missing or wrong.",
    403: "Cross-origin write (by Origin or Sec-Fetch-Site), or a foreign Host header on a server without ADMIN_TOKEN.",
    404: "No such job (or batch, or schedule, or job type: the message names the known ones).",
    409: "The job is not in a state that allows this (or the schedule name is in use, or the job has finished and "
         "takes no signal).",
    408: "The declared body did not arrive in time.",
    413: "Body larger than ADMIN_MAX_BODY_BYTES.",
    415: "A POST without Content-Type: application/json.",
    422: "A JSON body that does not fit: not an object, a field unknown, missing or out of range, an unknown job "
         "type or event, a payload that does not fit its class, an expires_at that is not a time to come, an "
         "unknown parent job in after, a schedule's bad name, cron expression or time zone, a bulk action's filter "
         "it does not take.",
    503: "The database refused, or the pipeline is shutting down.",
}


def _responses(ok: dict[str, Any], *codes: int) -> dict[str, Any]:
    out: dict[str, Any] = dict(ok)
    for code in sorted({400, 401, 403, 503, *codes}):
        out[str(code)] = _error(_ERRORS[code])
    return out


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_SCHEDULE_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}, "description": "The schedule's name."}
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}, "description": "The job's id (a UUID v7)."}
_TYPE_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}, "description": "The job type's name."}
_BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}, "description": "The batch's id."}


def _bulk(action: str, count: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The filter a bulk action takes and the counts it answers."""
    statuses = list(ACTIONS[action])
    taken = " or ".join(statuses)
    request: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {
            "status": {"type": "string", "enum": statuses,
                       "description": f"Only jobs of this status ({taken})." + (
                           "" if action == "delete" else f" Left out: every {taken} job.")},
            "job_type": {"type": "string", "minLength": 1, "description": "Only jobs of this type (any name the store holds)."},
        },
    }
    if action == "delete":
        request["required"] = ["status"]
    done = DONE[action]
    properties = {"matched": count, done: count}
    if action == "cancel":
        properties["cancel_requested"] = {**count, "description": "Running jobs asked to stop: their workers end them cancelled."}
    properties["skipped"] = {**count, "description": "Refused, or changed meanwhile (finished, deleted, started)."}
    properties["reasons"] = {"type": "array", "items": {"type": "string"}, "maxItems": 5,
                             "description": "Why jobs were skipped: the first few distinct messages."}
    answer = {"type": "object", "required": list(properties), "properties": properties}
    return request, answer


_SIGNAL_NAME = {"name": "name", "in": "path", "required": True,
                "schema": {"type": "string", "minLength": 1, "maxLength": MAX_SIGNAL_NAME_CHARS},
                "description": "The signal's name (what ctx.wait_for waits for)."}


def openapi_document(registry: Registry, *, auth: bool) -> dict[str, Any]:
    """The document; ``auth``: whether ADMIN_TOKEN is set (Bearer auth and 401s are listed then)."""
    statuses = [s.value for s in Status]
    job_types = registry.job_types()
    events = registry.event_names()
    count = {"type": "integer", "minimum": 0}
    bulk = {action: _bulk(action, count) for action in ACTIONS}
    by_status = {"type": "object", "required": statuses, "properties": {s: count for s in statuses}}
    relatives = {"type": "array", "items": {"type": "string"}, "maxItems": MAX_LISTED_RELATIVES}
    workflow_fields = {
        # no maxItems: the fuzz test would generate arrays of MAX_PARENTS + 1 ids to break it (seconds of CPU
        # for a body the server refuses by its size anyway); the description says the bound
        "after": {"type": "array", "nullable": True, "uniqueItems": True, "items": {"type": "string", "minLength": 1},
                  "description": "The ids of existing jobs it waits for, at most "
                                 f"{MAX_PARENTS:,}: it is stored waiting, and becomes pending once every one of them "
                                 "has completed (422 naming an unknown one; nothing inserted)."},
        "on_parent_failure": {"type": "string", "nullable": True, "enum": [*ON_PARENT_FAILURE, None],
                              "description": "With after: what a parent that ends dead or cancelled (or is deleted) "
                                             "does to it: cancel (the default) it, or run it once every parent has ended."},
    }
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {"code": {"type": "string", "enum": sorted(set(CODES.values()))}, "message": {"type": "string"}},
                }
            },
        },
        "Job": {
            "type": "object",
            "required": ["id", "job_type", "payload", "status", "attempts", "max_attempts", "run_after", "error",
                         "created_at", "updated_at", "priority", "unique_key", "result", "progress", "snoozes",
                         "expires_at", "cancel_requested", "limit_key", "parents", "parent_count", "waiting_for",
                         "children", "child_count", "batch", "on_parent_failure", "awaiting_signal", "steps"],
            "properties": {
                "id": {"type": "string"},
                "job_type": {"type": "string"},
                "payload": {"description": "The job's fields, as stored (JSON)."},
                "status": {"type": "string", "enum": statuses},
                "attempts": count,
                "max_attempts": {"type": "integer", "minimum": 1},
                "run_after": {"type": "string", "description": "ISO 8601 UTC: not run before this time."},
                "error": {"type": "string", "nullable": True, "description": "The last attempt's error."},
                "created_at": {"type": "string"},
                "updated_at": {"type": "string"},
                "priority": {"type": "integer", "description": "Lower runs first."},
                "unique_key": {"type": "string", "nullable": True,
                               "description": "While this job is pending or running, no other job of its type and key is inserted."},
                "result": {"nullable": True, "description": "A completed job's handler's return value (JSON); null: none."},
                "progress": {
                    "type": "object", "nullable": True, "required": ["fraction", "message"],
                    "description": "What its handler last reported (ctx.progress); null: nothing.",
                    "properties": {"fraction": {"type": "number", "minimum": 0, "maximum": 1},
                                   "message": {"type": "string", "nullable": True}},
                },
                "snoozes": {**count, "description": "Times its handler raised Snooze."},
                "expires_at": {"type": "string", "nullable": True,
                               "description": "ISO 8601 UTC: not started by then, it ends cancelled and never runs."},
                "cancel_requested": {"type": "boolean",
                                     "description": "It runs and was asked to stop: its worker ends it cancelled."},
                "limit_key": {"type": "string", "nullable": True,
                              "description": "The key it counts under for its type's per-key limit (limit_key=)."},
                "parents": {**relatives, "description": f"The jobs it waits or waited for (after), in the order given; "
                                                       f"at most {MAX_LISTED_RELATIVES} (parent_count: all). The job "
                                                       "list leaves it empty."},
                "parent_count": {**count, "description": "How many parents it has (0 in the job list)."},
                "waiting_for": {**count, "description": "While waiting: its parents that have not ended yet (under "
                                                        "on_parent_failure cancel: not completed yet)."},
                "children": {**relatives, "description": f"The jobs that wait or waited for it, oldest first; at most "
                                                         f"{MAX_LISTED_RELATIVES} (child_count: all). The job list "
                                                         "leaves it empty."},
                "child_count": {**count, "description": "How many children it has (0 in the job list)."},
                "batch": {"type": "string", "nullable": True,
                          "description": "The batch it belongs to, as one of its jobs or as its callback "
                                         "(GET /admin/batches/{batch_id}); null: none."},
                "on_parent_failure": {"type": "string", "enum": list(ON_PARENT_FAILURE),
                                      "description": "What a parent that ends dead or cancelled (or is deleted) does to "
                                                     "it while it waits: cancel it (and its own waiting children), or "
                                                     "run it once every parent has ended."},
                "awaiting_signal": {"type": "string", "nullable": True,
                                    "description": "While suspended in ctx.wait_for: the name of the signal it waits "
                                                   "for (POST /admin/jobs/{job_id}/signals/{name}); null otherwise."},
                "steps": {"type": "array", "items": _ref("Step"),
                          "description": "A durable job's steps in the order first written (docs/durable.md). The job "
                                         "list leaves it empty."},
            },
        },
        "Step": {
            "type": "object",
            "required": ["name", "status", "value", "started_at", "ended_at"],
            "properties": {
                "name": {"type": "string"},
                "status": {"type": "string", "enum": list(STEP_STATUSES),
                           "description": "completed: its value is kept and it does not run again; waiting: a "
                                          "ctx.wait_for whose signal has not come."},
                "value": {"description": "Its stored value (JSON; null: none)."},
                "started_at": {"type": "string"},
                "ended_at": {"type": "string", "nullable": True},
            },
        },
        "SignalSent": {
            "type": "object",
            "required": ["outcome", "job"],
            "properties": {
                "outcome": {"type": "string", "enum": ["woken", "kept"],
                            "description": "woken: the job was suspended waiting for this signal and is pending now; "
                                           "kept: it takes the signal when it reaches its wait."},
                "job": _ref("Job"),
            },
        },
        "Replay": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "from_step": {"type": "string", "nullable": True, "minLength": 1,
                              "description": "Run the job again with this step and every step after it forgotten "
                                             "(a completed job too); 422 naming its steps if it has none of this name."},
            },
        },
        "EnqueuedJob": {
            "allOf": [_ref("Job"), {
                "type": "object",
                "required": ["duplicate"],
                "properties": {"duplicate": {"type": "boolean", "description": (
                    "True: a pending or running job of the same type held the unique key, or the idempotency key "
                    "was used within JOB_IDEMPOTENCY_SECONDS; nothing was inserted, and this is that job.")}},
            }],
        },
        "EnqueuedJobRemoved": {
            "type": "object",
            "required": ["id", "duplicate"],
            "properties": {"id": {"type": "string"}, "duplicate": {"type": "boolean", "enum": [True], "description": (
                "The idempotency key names this job, removed since (retention, a delete): nothing was inserted.")}},
        },
        "JobList": {
            "type": "object",
            "required": ["items", "total", "page", "per_page"],
            "properties": {"items": {"type": "array", "items": _ref("Job")}, "total": count,
                           "page": {"type": "integer", "minimum": 1}, "per_page": {"type": "integer", "minimum": 1}},
        },
        "NewJob": {
            "type": "object",
            "additionalProperties": False,
            "required": ["job_type"],
            "properties": {
                "job_type": {"type": "string", "enum": job_types},
                "payload": {"type": "object", "description": "The job's fields; checked against its class."},
                "priority": {"type": "integer", "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX, "default": 5},
                "max_attempts": {"type": "integer", "minimum": 1, "maximum": INT32_MAX,
                                 "description": "Default: the type's own, else WORKER_DEFAULT_MAX_ATTEMPTS."},
                "run_after": {"type": "string", "nullable": True, "description": "ISO 8601 with its UTC offset (2030-01-02T03:04:05Z); without one: 422."},
                "unique_key": {"type": "string", "nullable": True, "minLength": 1, "maxLength": MAX_UNIQUE_KEY_CHARS,
                               "description": "While a job of this type and key is pending or running, insert nothing "
                                              "and answer that job (200, duplicate true)."},
                "idempotency_key": {"type": "string", "nullable": True, "minLength": 1, "maxLength": MAX_UNIQUE_KEY_CHARS,
                                    "description": "A second request of this type and key within JOB_IDEMPOTENCY_SECONDS "
                                                   "inserts nothing and answers the first one's job, whatever its status "
                                                   "(200, duplicate true): a request whose answer was lost can be sent again."},
                "expires_at": {"type": "string", "nullable": True,
                               "description": "ISO 8601 with its UTC offset (without one: 422), after now and after run_after: "
                                              "a job not started by then ends cancelled and never runs."},
                "unique_while": {"type": "string", "nullable": True, "enum": ["pending_or_running", "pending", None],
                                 "description": "How long unique_key is held: until the job finishes (the default), or "
                                                "only while it is pending (it frees when the job starts)."},
                **workflow_fields,
            },
        },
        "NewBatchJob": {
            "type": "object",
            "additionalProperties": False,
            "required": ["job_type"],
            "description": "A job of a batch: as a new job, without a unique key (every job of a batch is inserted).",
            "properties": {},  # NewJob's, those a batch's job takes: set below
        },
        "NewBatchCallback": {
            "type": "object",
            "additionalProperties": False,
            "required": ["job_type"],
            "description": "The batch's callback: it waits for every job of the batch and runs once each has ended "
                           "(completed, dead or cancelled); no unique key, no after of its own.",
            "properties": {},
        },
        "NewBatch": {
            "type": "object",
            "additionalProperties": False,
            "required": ["jobs"],
            "properties": {
                "jobs": {"type": "array", "minItems": 1, "items": _ref("NewBatchJob"),
                         "description": f"The batch's jobs, inserted in this order (at most {MAX_PARENTS} with a callback)."},
                "then": _ref("NewBatchCallback"),
            },
        },
        "EnqueuedBatch": {
            "type": "object",
            "required": ["id", "job_ids", "callback_id"],
            "properties": {
                "id": {"type": "string", "description": "The batch's id: GET /admin/batches/{batch_id}."},
                "job_ids": {"type": "array", "items": {"type": "string"}, "description": "Its jobs' ids, in the order given."},
                "callback_id": {"type": "string", "nullable": True, "description": "The callback's id; null without then."},
            },
        },
        "Batch": {
            "type": "object",
            "required": ["id", "callback_id", "callback_status", "created_at", "total", "finished", "counts", "jobs",
                         "limit", "offset"],
            "properties": {
                "id": {"type": "string"},
                "callback_id": {"type": "string", "nullable": True},
                "callback_status": {"type": "string", "nullable": True, "enum": [*statuses, None],
                                    "description": "null: no callback, or it was deleted."},
                "created_at": {"type": "string"},
                "total": {**count, "description": "The batch's jobs (the callback not counted)."},
                "finished": {**count, "description": "Those completed, dead or cancelled."},
                "counts": {"type": "object", "additionalProperties": count,
                           "description": "The batch's jobs by status (only the statuses that occur)."},
                "jobs": {
                    "type": "array",
                    "description": "A page of the batch's jobs (limit, offset), in the order they were enqueued.",
                    "items": {
                        "type": "object",
                        "required": ["id", "job_type", "status", "result", "error"],
                        "properties": {
                            "id": {"type": "string"},
                            "job_type": {"type": "string"},
                            "status": {"type": "string", "enum": statuses},
                            "result": {"nullable": True, "description": "A completed job's result (JSON); null otherwise."},
                            "error": {"type": "string", "nullable": True},
                        },
                    },
                },
                "limit": {"type": "integer", "minimum": 1},
                "offset": count,
            },
        },
        "Event": {
            "type": "object",
            "additionalProperties": False,
            "required": ["event"],
            "properties": {"event": {"type": "string", "enum": events}, "data": {"type": "object"}},
        },
        "JobIds": {"type": "object", "required": ["job_ids"],
                   "properties": {"job_ids": {"type": "array", "items": {"type": "string"}}}},
        "Cleanup": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "statuses": {"type": "array", "minItems": 1,
                             "items": {"type": "string", "enum": ["completed", "dead", "cancelled"]},
                             "default": ["completed", "dead"]},
                "older_than_seconds": {"type": "number", "nullable": True, "minimum": 0, "maximum": MAX_OLDER_THAN_SECONDS,
                                       "description": "Only records last updated longer ago than this (null: any age)."},
            },
        },
        "Deleted": {"type": "object", "required": ["deleted"], "properties": {"deleted": count}},
        "Stats": {
            "type": "object",
            "required": ["by_status", "by_type", "total", "finished_per_minute", "oldest_due_pending_age_seconds", "now"],
            "properties": {
                "by_status": {"type": "object", "additionalProperties": count},
                "by_type": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": count}},
                "total": count,
                "finished_per_minute": {
                    "type": "array",
                    "description": "The last 60 minutes, oldest first.",
                    "items": {"type": "object", "required": ["minute", "completed", "dead", "cancelled"],
                              "properties": {"minute": {"type": "string"}, "completed": count, "dead": count,
                                             "cancelled": count}},
                },
                "oldest_due_pending_age_seconds": {"type": "number", "nullable": True, "minimum": 0},
                "now": {"type": "string"},
            },
        },
        "Workers": {
            "type": "object",
            "required": ["workers"],
            "properties": {
                "workers": {
                    "type": "array",
                    "description": "Every worker process in the store's registry, the most recent heartbeat first.",
                    "items": {
                        "type": "object",
                        "required": ["owner", "job_types", "heartbeat_at", "alive"],
                        "properties": {
                            "owner": {"type": "string", "description": "host:pid:nonce, as in the leases it holds"},
                            "job_types": {"type": "array", "items": {"type": "string"}},
                            "heartbeat_at": {"type": "string"},
                            "alive": {"type": "boolean", "description": "It beat within its own lease."},
                        },
                    },
                },
            },
        },
        "Schedule": {
            "type": "object",
            "required": ["name", "cron", "timezone", "job_type", "payload", "enabled", "state", "origin", "next_run",
                         "last_run", "last_job_id", "created_at", "updated_at"],
            "properties": {
                "name": {"type": "string"},
                "cron": {"type": "string"},
                "timezone": {"type": "string"},
                "job_type": {"type": "string"},
                "payload": {"description": "The job's fields, as stored (JSON)."},
                "enabled": {"type": "boolean"},
                "state": {"type": "string", "enum": ["active", "paused", "removed from code"]},
                "origin": {"type": "string", "enum": ["code", "operator"]},
                "next_run": {"type": "string", "description": "ISO 8601 UTC: the next tick."},
                "last_run": {"type": "string", "nullable": True, "description": "The tick last fired."},
                "last_job_id": {"type": "string", "nullable": True},
                "created_at": {"type": "string"},
                "updated_at": {"type": "string"},
            },
        },
        "Schedules": {"type": "object", "required": ["schedules"],
                      "properties": {"schedules": {"type": "array", "items": _ref("Schedule")}}},
        "NewSchedule": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "cron", "job_type"],
            "properties": {
                "name": {"type": "string", "description": "Unique: 1-100 letters, digits, _.:-"},
                "cron": {"type": "string", "description": "5 fields (minute hour day month weekday), or 6 with seconds first."},
                "job_type": {"type": "string", "enum": job_types},
                "payload": {"type": "object", "description": "The job's fields; checked against its class."},
                "timezone": {"type": "string", "default": "UTC", "description": "IANA name the expression is read in."},
            },
        },
        **{f"{action.capitalize()}Filter": request for action, (request, _) in bulk.items()},
        **{f"{action.capitalize()}Counts": answer for action, (_, answer) in bulk.items()},
        "JobType": {
            "type": "object",
            "required": ["name", "paused", "registered", "concurrency", "global_limit", "rate_limit", "counts"],
            "properties": {
                "name": {"type": "string"},
                "paused": {"type": "boolean", "description": "No job of it starts, in any process on the store."},
                "registered": {"type": "boolean", "description": "False: only the store knows it (jobs, or a pause, "
                                                                 "left from a type the application no longer has)."},
                "concurrency": {"type": "integer", "minimum": 1, "nullable": True,
                                "description": "Workers each process runs for it (its own, else WORKER_CONCURRENCY)."},
                "global_limit": {"type": "integer", "minimum": 1, "nullable": True,
                                 "description": "The most of its jobs that run at once across every process."},
                "rate_limit": {"type": "string", "nullable": True,
                               "description": "The most of its jobs that start in a window across every process: "
                                              "N/s, N/m or N/h (WORKER_RATE_LIMITS, rate_limit=); null: none."},
                "counts": by_status,
            },
        },
        "JobTypes": {"type": "object", "required": ["types"],
                     "properties": {"types": {"type": "array", "items": _ref("JobType")}}},
        "Health": {"type": "object", "required": ["status", "workers"],
                   "properties": {"status": {"type": "string", "enum": ["ok"]},
                                  "workers": {"type": "integer", "minimum": 0,
                                              "description": "Processes running jobs behind this API: 1 or 0 "
                                                             "(WORKER_ENABLED); under a supervisor, its worker processes."}}},
    }
    for name, fields in (("NewBatchJob", BATCH_JOB_FIELDS), ("NewBatchCallback", CALLBACK_FIELDS)):
        schemas[name]["properties"] = {f: schemas["NewJob"]["properties"][f] for f in fields}
    public: list[dict[str, Any]] = []
    paths: dict[str, Any] = {
        "/admin/jobs": {
            "get": {
                "operationId": "listJobs",
                "summary": "List jobs, newest first or in claim order",
                "parameters": [
                    {"name": "status", "in": "query", "schema": {"type": "string", "enum": statuses}},
                    {"name": "job_type", "in": "query", "schema": {"type": "string", "minLength": 1}},
                    {"name": "priority", "in": "query", "description": "Only jobs of this priority.",
                     "schema": {"type": "integer", "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX}},
                    {"name": "order", "in": "query",
                     "description": "newest: newest first; claim: the order workers take pending jobs in "
                                    "(priority, then due time, then insertion).",
                     "schema": {"type": "string", "enum": list(LIST_ORDERS), "default": "newest"}},
                    {"name": "page", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 1}},
                    {"name": "per_page", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PER_PAGE, "default": 50}},
                ],
                "responses": _responses({"200": _json(_ref("JobList"), "A page of jobs.")}, 400),
            },
            "post": {
                "operationId": "createJob",
                "summary": "Enqueue one job",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("NewJob")}}},
                "responses": _responses({"201": _json(_ref("EnqueuedJob"), "The new job (duplicate false)."),
                                         "200": _json({"anyOf": [_ref("EnqueuedJob"), _ref("EnqueuedJobRemoved")]},
                                                      "A duplicate: the pending or running job holding the unique key, "
                                                      "or the job the idempotency key names (duplicate true; only its "
                                                      "id once it was removed); nothing was inserted.")},
                                        408, 413, 415, 422),
            },
        },
        "/admin/jobs/cleanup": {
            "post": {
                "operationId": "cleanupJobs",
                "summary": "Delete completed and dead job records",
                "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("Cleanup")}}},
                "responses": _responses({"200": _json(_ref("Deleted"), "How many records were deleted.")}, 408, 413, 415, 422),
            }
        },
        **{f"/admin/jobs/{action}": {
            "post": {
                "operationId": f"{action}Jobs",
                "summary": summary,
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": _ref(f"{action.capitalize()}Filter")}}},
                "responses": _responses({"200": _json(_ref(f"{action.capitalize()}Counts"), "What it did.")},
                                        408, 413, 415, 422),
            }
        } for action, summary in (
            ("cancel", "Cancel every waiting, pending or running job that matches a filter, in batches"),
            ("retry", "Every dead or cancelled job that matches a filter back to pending, in batches"),
            ("delete", "Delete every job of a status (not running) that matches a filter, in batches"),
        )},
        "/admin/jobs/{job_id}": {
            "parameters": [_JOB_ID],
            "get": {
                "operationId": "getJob",
                "summary": "One job with its payload and error",
                "responses": _responses({"200": _json(_ref("Job"), "The job.")}, 404),
            },
            "delete": {
                "operationId": "deleteJob",
                "summary": "Delete a job record (not while it runs)",
                "responses": _responses({"204": {"description": "Deleted."}}, 404, 409),
            },
        },
        "/admin/jobs/{job_id}/retry": {
            "parameters": [_JOB_ID],
            "post": {
                "operationId": "retryJob",
                "summary": "A dead or cancelled job back to pending: attempts reset, due now (with from_step: "
                           "a replay, which a completed job takes too)",
                "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("Replay")}}},
                "responses": _responses({"200": _json(_ref("Job"), "The job, now pending.")}, 404, 408, 409, 413, 415, 422),
            },
        },
        "/admin/jobs/{job_id}/signals/{name}": {
            "parameters": [_JOB_ID, _SIGNAL_NAME],
            "post": {
                "operationId": "signalJob",
                "summary": "Send a signal to a job: a job suspended in ctx.wait_for(name) resumes; one that has not "
                           "reached its wait yet keeps it for that wait",
                "requestBody": {"required": False, "description": "The signal's payload: any JSON value (none: no body).",
                                "content": {"application/json": {"schema": {}}}},
                "responses": _responses({"200": _json(_ref("SignalSent"), "Sent.")}, 404, 408, 409, 413, 415, 422),
            },
        },
        "/admin/jobs/{job_id}/cancel": {
            "parameters": [_JOB_ID],
            "post": {
                "operationId": "cancelJob",
                "summary": "Cancel a job: a waiting or pending one at once; a running one is asked to stop (cancel_requested)",
                "responses": _responses({"200": _json(_ref("Job"), "The job: cancelled, or running with cancel_requested.")},
                                        404, 409, 415),
            },
        },
        "/admin/types": {
            "get": {
                "operationId": "listTypes",
                "summary": "Every job type: paused or not, its limits, its jobs by status",
                "responses": _responses({"200": _json(_ref("JobTypes"), "The job types.")}),
            },
        },
        "/admin/types/{name}/pause": {
            "parameters": [_TYPE_NAME],
            "post": {
                "operationId": "pauseType",
                "summary": "No new job of the type starts in any process (enqueues are still accepted; running ones finish)",
                "responses": _responses({"200": _json(_ref("JobType"), "The type, paused.")}, 404, 415),
            },
        },
        "/admin/types/{name}/resume": {
            "parameters": [_TYPE_NAME],
            "post": {
                "operationId": "resumeType",
                "summary": "Jobs of the type start again",
                "responses": _responses({"200": _json(_ref("JobType"), "The type, running again.")}, 404, 415),
            },
        },
        "/admin/batches": {
            "post": {
                "operationId": "createBatch",
                "summary": "Enqueue a batch of jobs, and a callback that runs once every one of them has ended",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("NewBatch")}}},
                "responses": _responses({"201": _json(_ref("EnqueuedBatch"), "The batch's id, its jobs' and its callback's.")},
                                        408, 413, 415, 422),
            },
        },
        "/admin/batches/{batch_id}": {
            "parameters": [_BATCH_ID],
            "get": {
                "operationId": "getBatch",
                "summary": "A batch's progress: its jobs counted by status, its callback's status, a page of its jobs",
                "parameters": [
                    {"name": "limit", "in": "query", "description": "Jobs per page.",
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PER_PAGE, "default": DEFAULT_PER_PAGE}},
                    {"name": "offset", "in": "query", "description": "Jobs to skip, in the order they were enqueued.",
                     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "default": 0}},
                ],
                "responses": _responses({"200": _json(_ref("Batch"), "The batch.")}, 404),
            },
        },
        "/admin/events": {
            "post": {
                "operationId": "emitEvent",
                "summary": "Emit a domain event: insert the jobs it routes to",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("Event")}}},
                "responses": _responses({"201": _json(_ref("JobIds"), "The ids of the jobs the event routed to.")}, 408, 413, 415, 422),
            }
        },
        "/admin/stats": {
            "get": {
                "operationId": "stats",
                "summary": "Counts by status and type, throughput over the last hour, queue lag",
                "responses": _responses({"200": _json(_ref("Stats"), "The numbers.")}),
            }
        },
        "/admin/workers": {
            "get": {
                "operationId": "workers",
                "summary": "The worker processes on this store: what each handles, its last heartbeat, whether it lives",
                "responses": _responses({"200": _json(_ref("Workers"), "The processes.")}),
            }
        },
        "/admin/schedules": {
            "get": {
                "operationId": "listSchedules",
                "summary": "Every cron schedule, by name, with its next run",
                "responses": _responses({"200": _json(_ref("Schedules"), "The schedules.")}),
            },
            "post": {
                "operationId": "createSchedule",
                "summary": "Add a cron schedule (422 naming a bad name, cron expression, time zone, job type or payload)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("NewSchedule")}}},
                "responses": _responses({"201": _json(_ref("Schedule"), "The new schedule.")}, 408, 409, 413, 415, 422),
            },
        },
        "/admin/schedules/{name}": {
            "parameters": [_SCHEDULE_NAME],
            "delete": {
                "operationId": "removeSchedule",
                "summary": "Delete a schedule",
                "responses": _responses({"204": {"description": "Deleted."}}, 404),
            },
        },
        "/admin/schedules/{name}/pause": {
            "parameters": [_SCHEDULE_NAME],
            "post": {
                "operationId": "pauseSchedule",
                "summary": "Stop a schedule firing (kept, with its history)",
                "responses": _responses({"200": _json(_ref("Schedule"), "The schedule, paused.")}, 404, 415),
            },
        },
        "/admin/schedules/{name}/resume": {
            "parameters": [_SCHEDULE_NAME],
            "post": {
                "operationId": "resumeSchedule",
                "summary": "Fire a paused schedule again, from its first tick after now",
                "responses": _responses({"200": _json(_ref("Schedule"), "The schedule, active.")}, 404, 415),
            },
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (text format 0.0.4)",
                "responses": _responses(
                    {"200": {"description": "Metrics.", "content": {"text/plain": {"schema": {"type": "string"}}}}}
                ),
            }
        },
        "/healthz": {
            "get": {
                "operationId": "health",
                "summary": "200 while the database answers and the pipeline takes work",
                "security": public,
                "responses": {
                    "200": _json(_ref("Health"), "Healthy."),
                    "400": _error(_ERRORS[400]),
                    "403": _error(_ERRORS[403]),
                    "503": _error("The database does not answer or cannot commit, the Poller cannot claim, "
                                  "or the pipeline is shutting down: the message names which."),
                },
            }
        },
    }
    if not auth:
        for item in paths.values():
            for operation in item.values():
                if isinstance(operation, dict):
                    operation.get("responses", {}).pop("401", None)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "pipeline admin API",
            "version": "1",
            "description": "Operate the job store of a running pipeline: list, inspect, cancel, retry, delete, clean "
            "up, enqueue (jobs and batches), emit events, pause job types, cron schedules, send signals to durable "
            "jobs. When ADMIN_TOKEN is set, every /admin route and /metrics need "
            "`Authorization: Bearer <token>`.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}] if auth else [],
    }
