from run.helpers import daemon, engine_dir  # noqa: F401  (fixtures)
