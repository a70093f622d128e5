"""The ledger: the one durable memory of every generation, attempt, segment, stump and post."""

from .store import Ledger, LedgerError, LedgerWriteError

__all__ = ["Ledger", "LedgerError", "LedgerWriteError"]
