"""The read side: reading a database file, the Query sandbox, and the summary,
report and compare tools over the named views."""
