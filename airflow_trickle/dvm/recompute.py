"""The recompute applier: any other aggregate, HAVING, floating-point sums.

    K = the groups the input delta touches;  stored rows of K := γ(new input | K)

The affected groups are recomputed from the sources at the new version and replace their
stored rows (a group that vanished is deleted); a scalar aggregate's one row is recomputed.
"""
from __future__ import annotations

from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.sqltext import column_list as _list, with_identity as _with_identity
from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.names import quote_name
from airflow_trickle.sql.parse import DIALECT


def _recompute_merge(st, block: Block, versions: Versions) -> str:
    keys = block.affected_groups_sql(versions)
    fresh = block.render(_with_identity(block.restricted(versions, keys), block),
                         [n.state(versions, "new") for _, n in block.items]).sql(DIALECT)
    if not block.group:  # a scalar aggregate: its one row is recomputed
        keys = "SELECT xxhash64(0) AS __trickle_row_id"
    source = (f"SELECT __k.__trickle_row_id AS __key, __n.* FROM ({keys}) AS __k "
              f"LEFT JOIN ({fresh}) AS __n ON __k.__trickle_row_id = __n.`{ROW_ID}`")
    cols = st.output_columns + [ROW_ID, DUP]
    differs = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in st.output_columns)
    return (f"MERGE INTO {quote_name(st.name)} AS t USING ({source}) AS s "
            f"ON t.`{ROW_ID}` = s.__key AND t.`{DUP}` = 1 "
            f"WHEN MATCHED AND s.`{ROW_ID}` IS NULL THEN DELETE "
            f"WHEN MATCHED AND ({differs}) THEN UPDATE SET {', '.join(f't.`{c}` = s.`{c}`' for c in cols)} "
            f"WHEN NOT MATCHED AND s.`{ROW_ID}` IS NOT NULL THEN INSERT ({_list(cols)}) VALUES ({_list(cols, 's.')})")
