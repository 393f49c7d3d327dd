"""Which join inputs a delta term probes, by which keys, and how a probed term renders (no JVM)."""
from __future__ import annotations

from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.planner import plan
from airflow_trickle.dvm.probes import join_terms
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
    # the subquery is not a stored table: nothing to look up in it; its own scan is a single input
    query = ("SELECT o.id, t.n FROM s.o AS o JOIN (SELECT cid, COUNT(*) AS n FROM s.o GROUP BY cid) AS t "
             "ON o.cid = t.cid")
    assert probes(query, "s.o") == {}


def test_a_probed_term_reads_its_relations_and_the_other_terms_their_scans():
    query = "SELECT c.region, SUM(o.amount) AS s FROM s.o AS o JOIN s.c AS c ON o.cid = c.id GROUP BY c.region"
    node = plan(query, COLUMNS)
    v = versions("s.o", "s.c")
    plain = node.delta(v).sql(DIALECT)
    term = next(t for t in join_terms(node, v) if t.source == "s.o")
    bound = v.bind(term.block, f"probed {term.changed}", {0: ("__trickle_probed_d", term.change_columns),
                                                          1: ("__trickle_probed_c", term.probes[0].columns)})
    probed = node.delta(bound).sql(DIALECT)
    assert "__trickle_probed_d" in probed and "__trickle_probed_c" in probed
    assert "__trickle_probed" not in plain
    # o's change is read from the relation in its own term (wherever the join's delta is used: the
    # groups it touches and their sums); c's change term still reads its feed
    assert plain.count("TABLE_CHANGES('s.o'") == 2 and "TABLE_CHANGES('s.o'" not in probed
    assert probed.count("TABLE_CHANGES('s.c'") == plain.count("TABLE_CHANGES('s.c'")
    # a relation lacking a column the term reads is not used
    short = v.bind(term.block, f"probed {term.changed}", {1: ("__trickle_probed_c", ("id",))})
    assert "__trickle_probed_c" not in node.delta(short).sql(DIALECT)


def test_a_second_equality_with_a_known_input_filters_what_the_first_found():
    query = "SELECT o.id, c.region FROM s.o AS o, s.c AS c WHERE o.cid = c.id AND o.amount = c.nation"
    term = join_terms(plan(query, COLUMNS), versions("s.o"))[0]
    assert [(p.key, p.by_column, p.also) for p in term.probes] == [("id", "cid", ((0, "amount", "nation"),))]
