"""The read side: opening the database (directly or through the daemon's API),
loading the named views, and the summary, report and compare tools."""
