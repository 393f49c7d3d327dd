"""Everything that talks to Spark and Delta: the embedded session, table versions, commits."""
