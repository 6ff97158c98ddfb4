"""What the tests share, imported as `helpers.<module>` (tests/ is on the path).

`daemonproc` (a real daemon child process per test), `api` (one with its
gRPC API), `waiting.wait_for` (poll a condition, never a timed assertion),
`privileged.require_privileged` (skip, or fail in CI), `faults`,
`clientproc` and `fuzzwire` (the fault suite), `systemd` (units, notify,
activation), `sched` and `sched_workload` (the scheduling probes), `gpu`
(the GPU probe on a real Store). Fixtures live in conftest.py files, never
here.
"""
