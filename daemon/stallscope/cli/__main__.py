"""`python -m stallscope.cli ...` is the `stallscope` command."""

import sys

from stallscope.cli import main

sys.exit(main())
