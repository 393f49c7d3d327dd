"""``python -m airflow_trickle.cli``: the ``trickle`` command."""
import sys

from airflow_trickle.cli import main

sys.exit(main())
