"""Attach presets for `stallscope run --preset NAME` (one `NAME.toml` per engine),
shipped as the data package `stallscope.presets`; `stallscope.cli.run` finds them."""
