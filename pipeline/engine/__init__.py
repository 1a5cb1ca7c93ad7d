"""The engine: the wiring (``open_pipeline``), the messages between actors, the drawings of both.

The actors themselves are in ``actors/``, one module each, in the order a job meets them:
bus → enqueuer → (the backend) → poller → pools, with the lease keeper beside them. None of
them imports the wiring; each takes its channels and the few things it calls as arguments.
"""
