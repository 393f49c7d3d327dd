"""Entry points that run a refresh outside the Python API: the Spark application of a task."""
