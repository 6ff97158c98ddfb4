"""The built-in serving-engine scenario (shaped like the seed report's engine)
and the demo runner behind `stallscope demo`."""
