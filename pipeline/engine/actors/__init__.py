"""The actors, one trio task (or a pool of them) each, joined by memory channels:

    bus.py       the EventBus: business code's events to every subscriber
    enqueuer.py  events to jobs, inserted through the backend in one call per batch
    poller.py    claims for the handler pools, never more than they have room for
    pools.py     per-type workers: run a handler, write its outcome
    leases.py    the heartbeat thread that renews leases, the keeper that rescues expired ones

The SQLite backend's Ledger (backends/sqlite/ledger.py) is an actor too, inside its backend.
"""
