"""Where stream tables' rows live: their Delta storage tables and the Delta logs read without Spark."""
