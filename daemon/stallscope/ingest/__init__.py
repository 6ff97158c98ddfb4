"""Probe ingest: the probe socket (SO_PEERCRED, SOCK_SEQPACKET), decoding
fixed-size records into column batches, runs and their connections, and the
heap census. It hands batches to a store and never blocks a client."""
