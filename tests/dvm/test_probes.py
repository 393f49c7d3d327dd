"""Which join inputs a delta term probes, by which keys, and how a probed term renders (no JVM)."""
from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.bindings import GroupRows, OuterRows, Relation
from airflow_trickle.dvm.planner import plan
from airflow_trickle.dvm.join_terms import join_terms
from airflow_trickle.sql.parse import DIALECT

COLUMNS = {"s.o": ["id", "cid", "amount", "day"], "s.c": ["id", "region", "nation"], "s.x": ["k", "v"],
           "s.n": ["nation", "name"]}


def versions(*changed: str, cdf: bool = True) -> Versions:
    return Versions(old={n: 3 for n in COLUMNS}, new={n: 5 if n in changed else 3 for n in COLUMNS},
                    columns=COLUMNS, use_cdf={n: cdf for n in COLUMNS}, consolidate=False)


def probes(query: str, *changed: str, cdf: bool = True) -> dict[str, list[tuple]]:
    node = plan(query, COLUMNS)
    return {t.source: [(p.source, p.key, p.by_column, p.which) for p in t.probes]
            for t in join_terms(node, versions(*changed, cdf=cdf))}


def test_a_chain_of_equalities_is_probed_outwards_from_each_change():
    query = ("SELECT n.name, SUM(o.amount) AS s FROM s.c AS c, s.o AS o, s.n AS n "
             "WHERE c.id = o.cid AND c.nation = n.nation AND o.day > DATE '2020-01-01' GROUP BY n.name")
    assert probes(query, "s.o", "s.c") == {
        # c comes before o: in o's term it is read new; n after both: old
        "s.c": [("s.o", "cid", "id", "old"), ("s.n", "nation", "nation", "old")],
        "s.o": [("s.c", "id", "cid", "new"), ("s.n", "nation", "nation", "old")],
    }
    term = join_terms(plan(query, COLUMNS), versions("s.o"))[0]
    assert term.change_columns == ("amount", "cid", "day")  # only what the block reads
    assert [p.columns for p in term.probes] == [("id", "nation"), ("name", "nation")]


def test_only_equalities_of_plain_columns_every_output_row_must_satisfy():
    # a theta join, an expression and <=> (it would match NULL keys) give no key to probe by
    assert probes("SELECT o.id, x.k FROM s.o AS o JOIN s.x AS x ON o.amount > x.v", "s.o") == {}
    assert probes("SELECT o.id, x.k FROM s.o AS o JOIN s.x AS x ON o.amount + 1 = x.v", "s.o") == {}
    assert probes("SELECT o.id, x.k FROM s.o AS o JOIN s.x AS x ON o.amount <=> x.v", "s.o") == {}
    # an OR of equalities does not restrict either side
    assert probes("SELECT o.id FROM s.o AS o, s.x AS x WHERE o.amount = x.v OR o.id = x.k", "s.o") == {}
    # one equality among other conjuncts does
    assert probes("SELECT o.id FROM s.o AS o, s.x AS x WHERE o.amount = x.v AND o.id > x.k", "s.o") == {
        "s.o": [("s.x", "v", "amount", "old")]}


def test_a_left_joins_on_restricts_its_right_side_only():
    # o's change probes c through the ON; a change of c (the null-supplying side) is no linear term
    assert probes("SELECT o.id, c.region FROM s.o AS o LEFT JOIN s.c AS c ON o.cid = c.id", "s.o", "s.c") == {
        "s.o": [("s.c", "id", "cid", "old")]}
    # x's change reaches o by an inner ON; c, preserved by the LEFT JOIN, may not be restricted by
    # its ON: a row of c without a partner in o is still output
    query = ("SELECT c.id, o.amount, x.v FROM s.c AS c LEFT JOIN s.o AS o ON c.id = o.cid "
             "JOIN s.x AS x ON x.k = o.amount")
    assert probes(query, "s.x") == {"s.x": [("s.o", "amount", "k", "new")]}


def test_no_probe_for_a_full_join_a_snapshot_source_or_a_subquery_input():
    assert probes("SELECT o.id, c.id AS c FROM s.o AS o FULL JOIN s.c AS c ON o.cid = c.id", "s.o") == {}
    assert probes("SELECT o.id, c.region FROM s.o AS o JOIN s.c AS c ON o.cid = c.id", "s.o", cdf=False) == {}
    # a subquery that is not an aggregate of one table by the key: nothing to look up in it
    query = ("SELECT o.id, t.n FROM s.o AS o JOIN (SELECT o.cid, COUNT(*) AS n FROM s.o AS o JOIN s.c AS c "
             "ON o.cid = c.id GROUP BY o.cid) AS t ON o.cid = t.cid")
    node = plan(query, COLUMNS)
    # (the subquery's own join is probed inside it; the outer block is not)
    assert [t.block for t in join_terms(node, versions("s.o"))] == [node.items[1][1]]
    query = ("SELECT o.id, t.n FROM s.o AS o JOIN (SELECT cid + 1 AS k, COUNT(*) AS n FROM s.o GROUP BY cid + 1) AS t "
             "ON o.cid = t.k")
    assert probes(query, "s.o") == {}


def test_a_probed_term_reads_its_relations_and_the_other_terms_their_scans():
    query = "SELECT c.region, SUM(o.amount) AS s FROM s.o AS o JOIN s.c AS c ON o.cid = c.id GROUP BY c.region"
    node = plan(query, COLUMNS)
    v = versions("s.o", "s.c")
    plain = node.delta(v).sql(DIALECT)
    term = next(t for t in join_terms(node, v) if t.source == "s.o")
    bound = v.bound(v.bindings.with_probed_term(term.block, term.changed, {
        0: Relation("__trickle_probed_d", term.change_columns), 1: Relation("__trickle_probed_c", term.probes[0].columns)}))
    probed = node.delta(bound).sql(DIALECT)
    assert "__trickle_probed_d" in probed and "__trickle_probed_c" in probed
    assert "__trickle_probed" not in plain
    # o's change is read from the relation in its own term (wherever the join's delta is used: the
    # groups it touches and their sums); c's change term still reads its feed
    assert plain.count("TABLE_CHANGES('s.o'") == 2 and "TABLE_CHANGES('s.o'" not in probed
    assert probed.count("TABLE_CHANGES('s.c'") == plain.count("TABLE_CHANGES('s.c'")
    # a relation lacking a column the term reads is not used
    short = v.bound(v.bindings.with_probed_term(term.block, term.changed, {1: Relation("__trickle_probed_c", ("id",))}))
    assert "__trickle_probed_c" not in node.delta(short).sql(DIALECT)


def test_a_second_equality_with_a_known_input_filters_what_the_first_found():
    query = "SELECT o.id, c.region FROM s.o AS o, s.c AS c WHERE o.cid = c.id AND o.amount = c.nation"
    term = join_terms(plan(query, COLUMNS), versions("s.o"))[0]
    assert [(p.key, p.by_column, p.also) for p in term.probes] == [("id", "cid", ((0, "amount", "nation"),))]


EXISTS = ("SELECT c.region, COUNT(*) AS n FROM s.c AS c WHERE EXISTS "
          "(SELECT 1 FROM s.o AS o WHERE o.cid = c.id AND o.amount > 5) GROUP BY c.region")


def qualified(query: str) -> str:
    """``query`` qualified and its subqueries unnested, as a stream table's definition is."""
    from sqlglot.optimizer.qualify import qualify

    from airflow_trickle.sql.parse import parse_query

    schema = {"s": {t.split(".")[1]: {c: "int" for c in cols} for t, cols in COLUMNS.items()}}
    return qualify(parse_query(query), schema=schema, dialect=DIALECT).sql(DIALECT)


def test_an_aggregate_of_one_table_joined_by_its_group_key_is_probed_through_the_table():
    from airflow_trickle.dvm.keyed import keyed_deltas

    node = plan(qualified(EXISTS), COLUMNS)
    terms = {t.source: t for t in join_terms(node, versions("s.o", "s.c"))}
    # c's change looks up o by cid (the subquery's group column), with what the subquery reads
    c_term = terms["s.c"]
    assert [(p.source, p.key, p.by_column, p.which, p.columns) for p in c_term.probes] == [
        ("s.o", "cid", "id", "old", ("amount", "cid"))]
    assert not c_term.aggregated
    # o's change reaches the block through the aggregate: its change rows give the keys c is
    # probed by (at the new version: c comes first)
    o_term = terms["s.o"]
    assert o_term.aggregated and o_term.change_columns == ("amount", "cid")
    assert [(p.source, p.key, p.by_column, p.which) for p in o_term.probes] == [("s.c", "id", "cid", "new")]
    # and the aggregate's own touched groups are recomputed from o probed by the change's cids
    [grouped] = keyed_deltas(node, versions("s.o"))
    assert (grouped.source, grouped.key, grouped.columns) == ("s.o", "cid", ("amount", "cid"))
    assert keyed_deltas(node, versions("s.c")) == ()  # o did not change: its aggregate has no delta


def test_a_probed_aggregate_renders_as_the_aggregate_of_the_rows_found():
    from airflow_trickle.dvm.keyed import keyed_deltas

    node = plan(qualified(EXISTS), COLUMNS)
    v = versions("s.o", "s.c")
    c_term = next(t for t in join_terms(node, v) if t.source == "s.c")
    o_term = next(t for t in join_terms(node, v) if t.source == "s.o")
    [grouped] = keyed_deltas(node, v)
    bound = v.bound(v.bindings
                    .with_probed_term(c_term.block, c_term.changed, {
                        0: Relation("__trickle_probed_dc", ("id", "region")),
                        1: Relation("__trickle_probed_o", ("amount", "cid"))})
                    .with_probed_term(o_term.block, o_term.changed, {0: Relation("__trickle_probed_c", ("id", "region"))})
                    .with_group_rows(grouped.block, GroupRows(
                        old={0: Relation("__trickle_probed_o_old", ("amount", "cid"))},
                        new={0: Relation("__trickle_probed_o_new", ("amount", "cid"))})))
    # the top COUNT is applied from its input's delta (``dvm/algebraic.py``)
    region = [exp.column("region", table="c", quoted=True)]
    sql, plain = node.input_delta_sql(bound, region), node.input_delta_sql(v, region)
    for view in ("__trickle_probed_dc", "__trickle_probed_o", "__trickle_probed_c", "__trickle_probed_o_old",
                 "__trickle_probed_o_new"):
        assert view in sql, view
    # no stored version of o is read any more, where the plain delta reads it at both versions
    assert "`s`.`o` VERSION AS OF" in plain and "`s`.`o` VERSION AS OF" not in sql
    # the aggregate's own change (o's term) is its delta, not o's change rows
    assert "TABLE_CHANGES('s.o'" in sql


def test_an_aggregate_not_grouped_by_plain_columns_of_one_table_is_not_probed():
    assert plan("SELECT o.cid + 1 AS k, COUNT(*) AS n FROM s.o AS o GROUP BY o.cid + 1", COLUMNS).keyed() is None
    assert plan("SELECT COUNT(*) AS n FROM s.o AS o", COLUMNS).keyed() is None  # no group
    two = plan("SELECT o.cid, COUNT(*) AS n FROM s.o AS o JOIN s.c AS c ON o.cid = c.id GROUP BY o.cid", COLUMNS)
    assert two.keyed() is None  # two tables: a group holds rows of both


def exists_groups_probed():
    """:data:`EXISTS`'s subquery aggregate when o changed, and versions with its touched groups'
    rows bound at both sides, as a refresh binds them."""
    from airflow_trickle.dvm.keyed import keyed_deltas

    v = versions("s.o")
    [grouped] = keyed_deltas(plan(qualified(EXISTS), COLUMNS), v)
    return grouped, v.bound(v.bindings.with_group_rows(grouped.block, GroupRows(
        old={0: Relation("__trickle_probed_o_old", ("amount", "cid"))},
        new={0: Relation("__trickle_probed_o_new", ("amount", "cid"))})))


def test_the_null_group_of_a_probed_aggregate_is_read_from_its_table():
    grouped, probed = exists_groups_probed()
    without = grouped.block.delta(probed).sql(DIALECT)
    assert "VERSION AS OF" not in without
    rows = probed.bindings.group_rows(grouped.block)
    nulls = probed.bound(probed.bindings.with_group_rows(grouped.block, replace(rows, null_rows="cid")))
    with_nulls = grouped.block.delta(nulls).sql(DIALECT)
    # each side: the rows found, plus the table's rows of the NULL group at that side's version
    for view, version in (("__trickle_probed_o_old", 3), ("__trickle_probed_o_new", 5)):
        assert (f"SELECT `amount`, `cid` FROM {view} UNION ALL SELECT `amount`, `cid` FROM (SELECT `cid`, `amount` "
                f"FROM `s`.`o` VERSION AS OF {version}) AS __nulls WHERE `cid` IS NULL") in with_nulls


def test_an_outer_terms_inputs_are_probed_by_the_changes_join_keys():
    from airflow_trickle.dvm.outer_terms import OUTER_KEYS, outer_terms

    query = qualified("SELECT c.region, o.amount FROM s.c AS c LEFT JOIN s.o AS o ON c.id = o.cid "
                      "JOIN s.n AS n ON n.nation = c.nation")
    node = plan(query, COLUMNS)
    v = versions("s.o")
    [term] = outer_terms(node, v)
    # o's change: its rows and c's, by the change's cids; n reached from c (read at the old version)
    assert (term.changed, term.source, term.key, term.columns) == (1, "s.o", "cid", ("amount", "cid"))
    assert [(p.item, p.source, p.key, p.by, p.by_column, p.which) for p in term.probes] == [
        (0, "s.c", "id", OUTER_KEYS, "cid", "new"), (2, "s.n", "nation", 0, "nation", "old")]
    bound = v.bound(v.bindings.with_outer_term(term.block, 1, OuterRows(
        shared={0: Relation("__trickle_probed_c", ("id", "nation", "region")),
                2: Relation("__trickle_probed_n", ("nation",))},
        old={1: Relation("__trickle_probed_o_old", ("amount", "cid"))},
        new={1: Relation("__trickle_probed_o_new", ("amount", "cid"))})))
    sql, plain = node.delta(bound).sql(DIALECT), node.delta(v).sql(DIALECT)
    assert "VERSION AS OF" in plain and "VERSION AS OF" not in sql
    for view in ("__trickle_probed_c", "__trickle_probed_n", "__trickle_probed_o_old", "__trickle_probed_o_new"):
        assert view in sql, view
    # the change's keys still restrict both sides (the rows found are a superset of them)
    assert sql.count("LEFT SEMI JOIN") == plain.count("LEFT SEMI JOIN") > 0
    # a change of c, the preserved side, is a linear term: no outer term
    assert outer_terms(node, versions("s.c")) == ()


def origins(block, v) -> tuple[tuple, ...] | None:
    from airflow_trickle.dvm.group_probes import group_keys_of_changes, group_probes

    found = group_keys_of_changes(block, v, group_probes(block, v))
    return found and tuple((o.table, o.column, o.own, o.via and (o.via.source, o.via.key), o.value) for o in found)


def test_the_groups_an_aggregate_of_a_join_touches_are_bounded_by_the_changes_keys():
    from airflow_trickle.dvm.group_probes import group_probes

    inner = ("SELECT c.id, COUNT(o.id) AS n FROM s.c AS c LEFT JOIN s.o AS o ON c.id = o.cid "
             "JOIN s.n AS n ON n.nation = c.nation GROUP BY c.id")
    node = plan(qualified(f"SELECT n, COUNT(*) AS k FROM ({inner}) AS t GROUP BY n"), COLUMNS)
    block = node.items[0][1]
    chain = group_probes(block, versions("s.o"))
    assert (chain.source, chain.key) == ("s.c", "id")
    # o, the LEFT join's null-supplying side: its cids; c, the group column's own table: its ids
    assert origins(block, versions("s.o")) == (("s.o", "cid", False, None, None),)
    assert origins(block, versions("s.o", "s.c")) == (("s.c", "id", True, None, None),
                                                      ("s.o", "cid", False, None, None))
    # n is joined to c by another column: its nations look c up, whose ids are the groups
    assert origins(block, versions("s.n")) == (("s.n", "nation", True, ("s.c", "nation"), "id"),)
    # an inner equality with the group column bounds it too
    by_where = plan(qualified("SELECT c.id, SUM(o.amount) AS s FROM s.c AS c, s.o AS o WHERE o.cid = c.id "
                              "GROUP BY c.id"), COLUMNS)
    assert origins(by_where, versions("s.o")) == (("s.o", "cid", False, None, None),)


def test_a_change_two_equalities_from_the_group_column_reaches_it_through_the_input_between():
    query = ("SELECT c.id, SUM(x.v) AS s FROM s.c AS c JOIN s.o AS o ON o.cid = c.id "
             "JOIN s.x AS x ON x.k = o.id WHERE o.day > DATE '2020-01-01' GROUP BY c.id")
    block = plan(qualified(query), COLUMNS)
    # x reaches c.id only through o: its keys look o up by id, whose cids are the groups
    assert origins(block, versions("s.x")) == (("s.x", "k", False, ("s.o", "id"), "cid"),)
    assert origins(block, versions("s.x", "s.o")) == (("s.o", "cid", False, None, None),
                                                      ("s.x", "k", False, ("s.o", "id"), "cid"))
    # x joined by a LEFT join: its term is not linear, and its key pairs it with o, not c
    left = plan(qualified(query.replace("JOIN s.x", "LEFT JOIN s.x")), COLUMNS)
    assert origins(left, versions("s.x")) is None
    # two hops away: x reaches n only through o and c -- not bounded
    two = plan(qualified("SELECT n.name, SUM(x.v) AS s FROM s.n AS n, s.c AS c, s.o AS o, s.x AS x "
                         "WHERE n.nation = c.nation AND c.id = o.cid AND x.k = o.id GROUP BY n.name"), COLUMNS)
    assert origins(two, versions("s.x")) is None


def test_a_change_read_once_is_what_every_scan_of_it_reads():
    from airflow_trickle.dvm.base import operators
    from airflow_trickle.dvm.scan import Scan

    node = plan(qualified(EXISTS), COLUMNS)
    v = versions("s.o", "s.c")
    plain = node.input_delta_sql(v, [exp.column("region", table="c", quoted=True)])
    read = v
    for scan in operators(node):
        if isinstance(scan, Scan) and scan.name == "s.o":
            read = read.bound(read.bindings.with_change(scan, "__trickle_change_o"))
    sql = node.input_delta_sql(read, [exp.column("region", table="c", quoted=True)])
    # o's change feed was read at each use; now each use reads the one view
    assert plain.count("TABLE_CHANGES('s.o'") >= 2 and "TABLE_CHANGES('s.o'" not in sql
    assert sql.count("FROM __trickle_change_o") == plain.count("TABLE_CHANGES('s.o'")
    assert sql.count("TABLE_CHANGES('s.c'") == plain.count("TABLE_CHANGES('s.c'") > 0


def test_groups_looked_up_by_the_changes_keys_are_recomputed_without_the_input_delta():
    grouped, probed = exists_groups_probed()
    filtered = grouped.block.delta(probed).sql(DIALECT)
    rows = probed.bindings.group_rows(grouped.block)
    whole = grouped.block.delta(probed.bound(probed.bindings.with_group_rows(grouped.block, replace(rows, whole=True))))
    whole = whole.sql(DIALECT)
    # K, the groups the input delta touches, filters each side -- unless the rows looked up hold
    # exactly the groups of the change's keys: then each side is the aggregate of its rows
    assert "XXHASH64" in filtered and "TABLE_CHANGES('s.o'" in filtered
    assert "XXHASH64" not in whole and "TABLE_CHANGES" not in whole
    assert whole.count("__trickle_probed_o_old") == whole.count("__trickle_probed_o_new") == 1


def test_a_scan_lists_only_the_columns_its_select_reads():
    from airflow_trickle.dvm.base import operators
    from airflow_trickle.dvm.scan import Scan

    def scanned(query: str) -> dict[str, list[str]]:
        return {n.name: n.columns for n in operators(plan(query, COLUMNS)) if isinstance(n, Scan)}

    # the change of o is read, weighted, with the two columns the query reads: not id, not day
    assert scanned("SELECT `c`.`region` AS region, SUM(`o`.`amount`) AS total FROM `s`.`o` AS `o` "
                   "JOIN `s`.`c` AS `c` ON `o`.`cid` = `c`.`id` GROUP BY `c`.`region`") == {
        "s.o": ["cid", "amount"], "s.c": ["id", "region"]}
    # a table none of whose columns is read keeps its first; a nested SELECT's reads are its own
    assert scanned("SELECT COUNT(*) AS n FROM `s`.`o` AS `o`") == {"s.o": ["id"]}
    assert scanned("SELECT `x`.`v` AS v FROM (SELECT `o`.`day` AS v FROM `s`.`o` AS `o`) AS `x`") == {
        "s.o": ["day"]}
    delta = plan("SELECT `o`.`cid` AS cid FROM `s`.`o` AS `o`", COLUMNS).delta(versions("s.o")).sql(DIALECT)
    assert "SELECT `cid`, CASE WHEN _change_type" in delta and "`amount`" not in delta
    # an unqualified column could be any table's: every column is kept
    assert scanned("SELECT cid AS cid FROM `s`.`o` AS `o`") == {"s.o": COLUMNS["s.o"]}


def test_rows_found_alike_at_both_versions_are_handed_to_spark_once():
    import pyarrow as pa

    from airflow_trickle.refresh.lookup import Lookups

    class Engine:
        def __init__(self):
            self.views = []

        def local_relation(self, rows, view, schema=None):
            self.views.append((view, rows.num_rows))

    env = type("Env", (), {"engine": Engine()})()
    customers, orders_old, orders_new = (pa.table({"k": [1, 2]}), pa.table({"k": [1, 2, 3]}),
                                         pa.table({"k": [1, 3]}))
    run = Lookups(env, "s.t", tables=None, arrangements=None, scratch=[])
    bound = run.register_sides({"old": {0: (customers, ("k",)), 1: (orders_old, ("k",))},
                                "new": {0: (pa.table({"k": [1, 2]}), ("k",)), 1: (orders_new, ("k",))}})
    assert bound["old"][0] == bound["new"][0]  # the customers found: alike, one view
    assert bound["old"][1] != bound["new"][1]  # the orders: not
    assert len(env.engine.views) == 3 == len(run.scratch) and run.report.rows == 2 + 3 + 2
    # alike rows under other columns are another relation
    other = run.register_sides({"old": {0: (customers, ("k",))}, "new": {0: (customers, ("j",))}})
    assert other["old"][0] != other["new"][0]
