"""The ledger: the one durable memory of every generation, attempt, segment, stump and post."""

from .store import Ledger, LedgerError, LedgerInUse, LedgerWriteError, Superseded, hold_ledger

__all__ = ["Ledger", "LedgerError", "LedgerInUse", "LedgerWriteError", "Superseded", "hold_ledger"]
