"""SIGHUP: re-read the configuration and apply to the running daemon what can change live.

Live keys (see `config_keys.KEYS`, `live=True`): probe rates and retention
limits. A probe whose rate changed is restarted in place with the new
settings (stopped, which flushes what it holds, started again and told the
processes it followed); ingest, the store and the sockets are untouched, so
no stored or queued data is lost. Keys that need a restart are reported and
keep their running values. A file that does not load changes nothing: the
error is logged with its line and reason, and reported in STATUS=. This
module never raises into the daemon's loop.
"""

import logging

from stallscope.service import config as configmod
from stallscope.vocab.log_channels import log_channel

log = logging.getLogger(log_channel(__name__))

# The live key each probe reads, by probe name: a change restarts whichever
# backend runs (only the /proc backend uses probes.sched_poll_hz).
RATE_KEYS = {"sched": "probes.sched_poll_hz", "gpu": "probes.gpu_poll_hz"}


def apply(daemon):
    """Reload `daemon`'s configuration; True when a new one was applied."""
    source, old = daemon.config_source, daemon.config
    if source is None or old is None:
        log.info("SIGHUP: no configuration source to reload")
        return False
    notify = daemon.notify
    if notify:
        notify.reloading()
    try:
        new = source.load()
    except configmod.ConfigError as exc:
        log.error(
            "configuration NOT reloaded, the daemon keeps running with the previous one: %s", exc
        )
        if notify:
            notify.reloaded(daemon, error=str(exc))
        return False
    effective = dict(old)
    live_changes = []
    for key, before, after in configmod.diff(old, new):
        if key.live:
            effective[key.dotted] = after
            live_changes.append((key, before, after))
        else:
            log.warning(
                "%s changed (%r -> %r) but needs a restart: systemctl restart stallscope",
                key.dotted,
                before,
                after,
            )
    daemon.config = configmod.Config(effective, new.sources, new.path)
    if live_changes:
        _apply_live(daemon, live_changes)
        log.info(
            "configuration reloaded: %s",
            ", ".join(f"{k.dotted} {b!r} -> {a!r}" for k, b, a in live_changes),
        )
    else:
        log.info("configuration reloaded: nothing live changed")
    if notify:
        notify.reloaded(daemon)
    return True


def _apply_live(daemon, changes):
    changed = {k.dotted for k, _, _ in changes}
    configmod.probe_settings(daemon.config, daemon.settings)
    retention = getattr(daemon, "retention", None)
    if retention is not None and any(k.startswith("retention.") for k in changed):
        limits = retention.limits
        limits.max_db_mb = daemon.config["retention.max_db_mb"]
        limits.max_age_days = daemon.config["retention.max_age_days"]
        limits.check_interval_s = daemon.config["retention.check_interval_s"]
        retention.wake()
    for i, probe in enumerate(list(daemon.probes)):
        key = RATE_KEYS.get(probe.name)
        if key not in changed:
            continue
        detail = f"reconfigured: {key.split('.')[1]}={daemon.config[key]:g}"
        try:
            daemon.probes[i] = _restart(daemon, probe)
            detail += " (restarted)"
            daemon.store.record_probe_status(probe.name, probe.backend, "active", detail)
        except Exception as exc:
            log.error(
                "%s probe (%s) could not take the new settings: %s", probe.name, probe.backend, exc
            )
            daemon.store.record_probe_status(
                probe.name, probe.backend, "failed", f"reload: {type(exc).__name__}: {exc}"
            )


def _restart(daemon, probe):
    probe.stop()
    fresh = type(probe)(daemon.settings)
    fresh.start(daemon.sink)
    for pid in sorted(daemon.tracked_pids):
        try:
            fresh.track(pid)
        except Exception as exc:
            log.warning("%s probe could not follow pid %d again: %s", probe.name, pid, exc)
    return fresh
