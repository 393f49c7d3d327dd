"""The errors that mean "this process cannot read that table or file", as opposed to a bug.

delta-rs raises :class:`deltalake.exceptions.DeltaError` (and its subclasses: a table not found,
a protocol it does not support), the object store and the file system :class:`OSError`, Arrow
:class:`pyarrow.ArrowException` for data it cannot convert.  Where the engine has another way
-- Spark reads what delta-rs could not -- it catches exactly these, and lets anything else fail
the refresh, loudly, where ``refresh/decide.after_failure`` and the retries handle it.
"""
from __future__ import annotations

import pyarrow as pa
from deltalake.exceptions import DeltaError

#: Unreadable here: Spark reads it instead.
UNREADABLE = (DeltaError, OSError, pa.ArrowException)
