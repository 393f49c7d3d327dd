"""What every commit of one refresh carries, whichever engine makes it (:class:`CommitTag`),
and what a committer answers where its path does not apply (:class:`NotApplicable`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from deltalake import CommitProperties, Transaction

from airflow_trickle.names import commit_user_metadata


@dataclass(frozen=True)
class CommitTag:
    """What every commit of one refresh carries, whichever engine makes it."""

    metadata: dict
    txn_app_id: str
    txn_version: int
    #: Runs just before any commit: this process still holds the table's writer lease.
    fence: Callable[[], None] = field(compare=False)

    def delta_rs_properties(self) -> CommitProperties:
        return CommitProperties(custom_metadata={"userMetadata": commit_user_metadata(self.metadata)},
                                app_transactions=[Transaction(self.txn_app_id, int(self.txn_version))])

    def landed_in(self, table) -> bool:
        """Whether this refresh's transaction is in the delta-rs ``table`` already (a retry
        after its commit landed): nothing is written again, as Spark skips it too."""
        return (table.transaction_version(self.txn_app_id) or -1) >= self.txn_version


@dataclass(frozen=True)
class NotApplicable:
    """A committer's path does not apply to this change; ``reason`` says why."""

    reason: str
