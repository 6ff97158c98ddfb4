"""The shared vocabulary agrees with its other copies: the live-event kinds
with the proto's enum, and every backend spec in `PROBES` names a class that
loads."""

import pytest

from stallscope.api.v1 import stallscope_pb2 as pb
from stallscope.probes import registry
from stallscope.probes.base import Probe
from stallscope.vocab import event_kinds


def test_event_kinds_are_the_proto_enum():
    enum = pb.EventKind
    ours = {n: v for n, v in vars(event_kinds).items() if n.isupper() and isinstance(v, int)}
    assert ours == {n: enum.Value(n) for n in enum.keys() if n != "EVENT_KIND_UNSPECIFIED"}
    assert set(event_kinds.TABLE_KINDS.values()) == event_kinds.ALL_KINDS == set(ours.values())
    assert event_kinds.POINT_KINDS | event_kinds.INTERVAL_KINDS == event_kinds.ALL_KINDS
    assert not event_kinds.POINT_KINDS & event_kinds.INTERVAL_KINDS


@pytest.mark.parametrize(
    "spec", [s for specs in registry.PROBES.values() for s in specs], ids=lambda s: s
)
def test_every_probe_spec_loads(spec):
    cls = registry.load(spec)
    assert issubclass(cls, Probe) and cls.backend and cls.name
    assert spec in registry.PROBES[cls.name]
