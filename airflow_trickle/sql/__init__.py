"""SQL front end: parse, inspect and rewrite defining queries with sqlglot (Spark dialect).

Pure functions over sqlglot expression trees; nothing here touches Spark.
"""
