import pytest

from airflow_trickle.errors import InvalidNameError, InvalidQueryError
from airflow_trickle.names import qualify_name
from airflow_trickle.sql.parse import nondeterministic_calls, parse_query, source_names
from airflow_trickle.sql.rewrite import name_outputs, pin_sources, row_hash_sql
from airflow_trickle.storage.tables import column_mapping_properties


def test_qualify_name():
    assert qualify_name("Orders") == "default.orders"
    assert qualify_name("shop.Orders") == "shop.orders"
    for bad in ["", "a.b.c", "1abc", "shop.", "x-y", "__trickle_x"]:
        with pytest.raises(InvalidNameError):
            qualify_name(bad)


@pytest.mark.parametrize("text", ["SELEC 1", "SELECT FROM WHERE", "SELECT (1", "SELECT 1; SELECT 2",
                                  "INSERT INTO t VALUES (1)", "DROP TABLE t", "   "])
def test_bad_queries_are_rejected_with_the_table_name(text):
    with pytest.raises(InvalidQueryError) as err:
        parse_query(text, stream_table="shop.x")
    assert "shop.x" in str(err.value)


def test_sources_skip_ctes_and_include_subqueries():
    query = parse_query(
        "WITH big AS (SELECT * FROM shop.orders WHERE amount > 10) "
        "SELECT b.id FROM big b JOIN customers c ON b.cid = c.id WHERE b.id IN (SELECT id FROM shop.vip)"
    )
    assert source_names(query) == ["default.customers", "shop.orders", "shop.vip"]


def test_nondeterministic_calls():
    query = parse_query("SELECT rand() r, uuid() u, now() n, upper(x) FROM t")
    assert nondeterministic_calls(query) == ["rand", "uuid", "now"]
    assert nondeterministic_calls(parse_query("SELECT abs(x) FROM t")) == []


def test_pin_sources_reads_versions_and_hides_stream_table_columns():
    query = parse_query("SELECT * FROM shop.orders o JOIN shop.st s ON o.id = s.id")
    pinned = pin_sources(query, {"shop.orders": 7, "shop.st": 3}, {"shop.st": ["id", "total"]}).sql("spark")
    assert "shop.orders VERSION AS OF 7 AS o" in pinned
    assert "(SELECT `id`, `total` FROM shop.st VERSION AS OF 3) AS s" in pinned


@pytest.mark.parametrize("query,names,expected", [
    ("SELECT cid, SUM(amount) FROM s.o GROUP BY cid", ["cid", "sum(amount)"],
     "SELECT cid, SUM(amount) AS `sum(amount)` FROM s.o GROUP BY cid"),
    ("SELECT o.cid, COUNT(*), amount * 2 AS doubled FROM s.o o GROUP BY 1, 3", ["cid", "count(1)", "doubled"],
     "SELECT o.cid, COUNT(*) AS `count(1)`, amount * 2 AS doubled FROM s.o AS o GROUP BY 1, 3"),
    # a UNION is named by its first input; a star's positions are unknown before expansion
    ("SELECT a + 1 FROM s.x UNION ALL SELECT b FROM s.y", ["(a + 1)"],
     "SELECT a + 1 AS `(a + 1)` FROM s.x UNION ALL SELECT b FROM s.y"),
    ("SELECT *, 1 FROM s.x", ["a", "1"], "SELECT *, 1 FROM s.x"),
])
def test_unnamed_outputs_take_the_names_spark_gives_them(query, names, expected):
    assert name_outputs(parse_query(query), names).sql("spark") == expected


def test_names_delta_refuses_are_stored_with_column_mapping():
    assert column_mapping_properties(["cid", "total_qty"]) == {}
    assert column_mapping_properties(["cid", "sum(l_quantity)"])["delta.columnMapping.mode"] == "name"


def test_row_hash_is_null_safe_and_positional(spark):
    one_null = spark.sql(f"SELECT {row_hash_sql(['a', 'b'])} h FROM VALUES (1, NULL) AS t(a, b)").first().h
    null_one = spark.sql(f"SELECT {row_hash_sql(['a', 'b'])} h FROM VALUES (NULL, 1) AS t(a, b)").first().h
    naive_1 = spark.sql("SELECT xxhash64(1, NULL) h").first().h
    naive_2 = spark.sql("SELECT xxhash64(NULL, 1) h").first().h
    assert naive_1 == naive_2  # the trap this guards against
    assert one_null != null_one
