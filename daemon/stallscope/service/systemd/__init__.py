"""The systemd glue of the daemon: readiness and watchdog notifications,
socket activation, SIGTERM from the first moment, SIGHUP reload, and the API
endpoint published beside the database."""
