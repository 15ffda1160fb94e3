"""The worker: the control loop that drives agents' sandboxes and writes what
their bridges report into the transcript. One place, started two ways —
inside `manage.py serve` (the embedded default) or as `manage.py runworker`
(the scale-out shape); both start :mod:`.supervisor` on their event loop.

    consumer.py    channels consumer: a journaled command wakes the supervisor
    supervisor.py  one per process: which agents have work, one driver each,
                   lease heartbeat, the dead-sandbox watcher, housekeeping
    claims.py      taking/giving up leases (sessions/leases.py) + agent.worker facts
    driver.py      one task per agent: ensure the sandbox, act on its commands
    link.py        the driver's two connections to its bridge
    slots.py       the workspace's concurrent sandbox slots: claim, wait, release
    relay.py       bridge events → transcript, exactly once; the bridge's requests
    ladder.py      the restore ladder: reattach … lost; plans.py picks what a
                   fresh sandbox starts from, settling.py settles dangling turns
    operations.py  reattach / rebridge / checkpoint / home_snapshot commands a client waits for
    looks.py       a look at the live home: taken while the sandbox runs, else refused
    checkpoints.py turn checkpoints: archive, row, fact, rotation (one copy)
    retention.py   the checkpoint retention sweep (and expired live homes)
    store.py       the driver's reads and writes of the database
    context.py     shared types and the WorkerError root
"""
