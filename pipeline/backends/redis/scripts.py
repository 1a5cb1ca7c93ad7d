"""Every Lua script of the Redis job store, by name: one script per transition, each a file of
``lua/`` (shipped with the package, as BullMQ keeps its commands), with ``lua/prelude.lua`` prepended.

Each script runs atomically on the server (nothing else runs meanwhile), reads "now" from the
server's own ``TIME`` (one clock for every process), and checks the same fence as SQLite's
``WHERE id = ? AND status = 'running' AND lease_token = ?`` before it changes a running job.
A script that fails part-way is not rolled back by Redis, so each one validates everything
(duplicate ids, the fence) before its first write.

``ARGV[1]`` is always the key prefix (``{name}:``; the braces are a hash tag, so every key of
one store hashes to one slot). Keys (layout in docs/backends.md, "Key layout"):

    job:<id>              HASH  type payload status attempts max run prio created updated
                                token [error] [owner expires] [started] [ukey] [trace]
                                [expat] [result] [progress pmsg] [snoozes] [creq] [lkey] [uwhile]
                                [wfor] [opf] [kids] [batch] [await]
                                (times: epoch ms; trace: the enqueuer's trace context; expat: its
                                expires_at; creq: 1 while a running job's cancel is requested;
                                lkey: its limit key; uwhile: 1 if its unique key is held only
                                while pending; wfor: a job with parents: how many of its edges
                                have not counted yet; opf: 1 for on_parent_failure "run"; kids: 1
                                while it has children; batch: its batch's id; await: while
                                suspended in a ctx.wait_for, the signal's name)
    ready:<type>:<prio>   ZSET  pending jobs (without a limit key) of one type and priority, score
                                run (ms), member id: due ones are a range by score; ties go by id
                                (member order)
    prios:<type>          ZSET  the priorities that have a ready set, score = priority
    pdue:<type>           ZSET  the claim's index: those of them whose first job is due, score = priority
    pwait:<type>          ZSET  and the others, score = when their first job is due (ms); every script
                                that adds to or takes from a ready set keeps the two in step
    ptypes                SET   the types that have pending jobs
    leases                ZSET  running jobs, score = lease expiry (ms)
    suspended             ZSET  suspended jobs (durable functions: in no ready set), score = when due
                                (ms; 253402300799999, base.FOREVER, for none): wake_suspended reads
                                the due ones as a range
    steps:<id>            HASH  a durable job's steps: name -> "<place> <status>NUL<started>NUL<ended>NUL
                                [v<value>]" (place: 1, 2, ... in the order first written)
    sig:<id>              HASH  the signals sent to a job: t:<name> (sent), h:<name> (consumed),
                                e:<i>:<name> (the i-th one's payload, "v<JSON>" or "", until consumed),
                                k:<key> (each signal key used); steps and signals go with their job
    all, type:<t>, status:<s>, st:<s>:<t>
                          ZSET  every job / of a type / of a status / both (status:waiting: the
                                waiting jobs, in no ready set; no status:<s> for pending, running
                                and completed, which every job passes through: layout 7 reads
                                those across types from the types' sets), score 0: lexicographic
                                by id, which is time-ordered (UUID v7): newest first is a reverse range
                                (ZCARD of st:running:<t>: what a type's global limit counts)
    done:<s>              ZSET  completed / dead / cancelled jobs, score = when they finished (ms)
    expiring:<type>       ZSET  the pending jobs of a type that have an expires_at, score = it (ms):
                                the claim ends the due ones cancelled before it claims the type
    etypes                SET   the types that have an expiring set (what the rescue's sweep visits)
    paused                HASH  paused type -> when it was paused (ms): claims skip its jobs
    creq:<owner>          SET   the running jobs of a lease owner whose cancel was requested
    kpend:<type>          ZSET  the pending jobs of a type that have a limit key, score = run (ms):
                                none of them is in a ready set, but in one of these two:
    kwait:<type>          ZSET  those not due when they became pending, score = run, until a claim
                                of the type moves them, once due, to
    kready:<n>:<type>:<key>
                          ZSET  the others of one limit key (n: the type's length, so that no type
                                and key make another pair's name), score = priority, member = run
                                (16 digits, + 10^15) then id: members sort in claim order
    kheads:<type>         ZSET  each key's first member of kready (its score and member): the keys
                                in the claim order of their first due job
    ktypes                SET   the types that have a kpend set
    krun:<n>:<type>:<key> SET   the running jobs of a type and limit key (what a key limit counts)
    rate:<type>           ZSET  a rate-limited type's claims, score = when (ms), member id:token;
                                the claim drops those a window old, and the key expires a window
                                after its last claim
    types                 SET   every type that has a job
    uniq:<type>           HASH  unique key -> id of the waiting, pending, running or suspended job of that type
                                holding it (job field ukey); deleted when that job finishes, dies or is
                                deleted, or (uwhile) is claimed. A hash per type: a type name may
                                hold ':', a key anything
    after:<id>            ZSET  a job's parents, score = their place in its ``after`` (0, 1, ...)
    children:<id>         ZSET  a job's children, score = their created (ms): oldest first
    down:<id>             SET   those of its children whose edge from it has not counted yet: what
                                its end applies (release_children, in the script that ends it)
    batch:<id>            HASH  a batch: created (ms) [cb] (its callback's id)
    bjobs:<id>            ZSET  its members, score = their place in the insert
    wsweep                STRING the last waiting job rescue_waiting visited (the next sweep goes on
                                from there)
    workers               HASH  owner -> "beat_ms|lease_ms|<json list of types>"
    schema                STRING the key layout's version (6: with issue 35's durable functions;
                                5: with issue 24's workflows; 4: with issue 23's limits; 3: with
                                its control; 2: with pdue/pwait; 1 to 5 are upgraded at open)
    sched:<name>          HASH  a cron schedule: type payload cron tz enabled origin declared next
                                [last job] created updated (times: the protocol's ISO text)
    scheds                SET   the names of every schedule
    scheds:due            ZSET  the enabled schedules, score = next run (ms): the due ones are a range
    wake                  pub/sub channel: a job became due (insert, release, revive, a snooze
                                of no delay, a type resumed, a waiting job woken by its parents, a
                                suspended job woken by its signal or its time)
"""

from __future__ import annotations

import hashlib
from importlib import resources

import attrs

RECORD_FIELDS = ("type", "payload", "status", "attempts", "max", "run", "error", "created", "updated", "prio", "owner",
                 "expires", "ukey", "result", "progress", "pmsg", "snoozes", "expat", "creq", "lkey", "wfor", "opf",
                 "batch", "await")  # (list.lua reads them too)


@attrs.frozen
class Script:
    name: str
    source: str
    sha: str

    @classmethod
    def of(cls, name: str, body: str) -> Script:
        source = _PRELUDE + body
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


_PRELUDE = _read("prelude")  # the functions every script shares: a Redis script cannot import
ALL: dict[str, Script] = {
    name: Script.of(name, _read(name))
    for name in sorted(entry.name.removesuffix(".lua") for entry in resources.files(__package__).joinpath("lua").iterdir()
                       if entry.name.endswith(".lua") and entry.name != "prelude.lua")
}
