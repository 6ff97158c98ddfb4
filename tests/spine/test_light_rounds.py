"""The main loop's light rounds: a client sending a few dozen datagrams a
second is read every LIGHT_ROUND_GAP_S, not woken for datagram by datagram.

A gathered read takes what was sent over the gap before it, so a rate
taken over the read window alone reads a slow client as a fast one (a
200 steps/s client: 45 datagrams a second, 9-10 a gathered read, read as
90 a second early in a window), and the loop then woke for every datagram
(12.9 wake-ups a second instead of 5, bench/daemon_preemption.py)."""

import types

from stallscope.ingest.listener import LIGHT_ROUND_GAP_S, RATE_WINDOW_S, Connection
from stallscope.service import server


def conn_with(rate, read_in_window, elapsed_s, now=1000.0):
    c = Connection(None, 1, 0, 0)
    c.rate = rate
    c.window_start = now - elapsed_s
    c.window_datagrams = read_in_window
    return c


def test_a_gathered_read_early_in_a_window_is_not_a_fast_client():
    # 45 a second; one 0.2 s gather (10 datagrams) read 0.1 s into a window
    c = conn_with(45.0, 10, 0.1)
    rate = c.datagram_rate(1000.0)
    assert rate * LIGHT_ROUND_GAP_S <= server.LIGHT_ROUND_MAX_BACKLOG
    assert rate < 60


def test_a_burst_is_still_seen_within_the_window():
    # a client that went from 45 to 1,000 a second: 100 read in 0.1 s
    c = conn_with(45.0, 100, 0.1)
    assert c.datagram_rate(1000.0) * LIGHT_ROUND_GAP_S > server.LIGHT_ROUND_MAX_BACKLOG
    # and from a complete window on, the window's own rate
    c = conn_with(45.0, 300, RATE_WINDOW_S)
    assert c.datagram_rate(1000.0) == 300 / RATE_WINDOW_S


def test_a_new_connection_has_no_rate_and_is_read_round_after_round():
    c = Connection(None, 1, 0, 0)
    assert c.datagram_rate(c.window_start + 0.5) is None
    ingest = types.SimpleNamespace(conns={1: c})
    ingest.slow_enough = lambda gap, most: server.Ingest.slow_enough(ingest, gap, most)
    assert not server.light_round(3, ingest)


def fake_ingest(slow):
    return types.SimpleNamespace(slow_enough=lambda gap, most: slow)


def test_a_round_of_a_gather_of_slow_clients_is_light():
    # what a 0.2 s gather of a 45 a second client holds: light, the loop
    # gathers again (it used to need fewer than 8, and 9-10 made it heavy)
    assert server.light_round(10, fake_ingest(True))
    assert server.light_round(server.LIGHT_ROUND_MAX_BACKLOG, fake_ingest(True))


def test_heavy_or_empty_rounds_or_fast_clients_are_not_light():
    assert not server.light_round(0, fake_ingest(True))
    assert not server.light_round(server.LIGHT_ROUND_MAX_BACKLOG + 1, fake_ingest(True))
    assert not server.light_round(5, fake_ingest(False))
