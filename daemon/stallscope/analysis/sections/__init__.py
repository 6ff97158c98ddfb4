"""Report sections about where and what ran rather than why a step was slow:
which probe watched which run (`coverage`, also in `stallscope status`), the
processes of each run group (`groups`) and the hang watchdog's dumps
(`hangs`). Each is a function `(con, where) -> text` that only reads."""
