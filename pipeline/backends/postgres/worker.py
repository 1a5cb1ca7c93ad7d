"""The worker side's calls on Postgres (``ServerBackend.calls``): the claim, which knows rate and key
limits (:func:`limits.claim`), the rate window's answer, and the store's rescue, burial of unknown
types, cancel requests and progress; a durable job's steps, its signals' consumption and the wake-up
of suspended jobs (durable.py). (The claim lives beside the limits' statements, which build on the
store's: the store imports neither.)"""

from .durable import steps, take_signal, wake_suspended
from .limits import claim, rate_free_at
from .store import bury_unknown_types, cancel_requests, rescue_expired, set_progress

__all__ = ["bury_unknown_types", "cancel_requests", "claim", "rate_free_at", "rescue_expired", "set_progress", "steps",
           "take_signal", "wake_suspended"]
