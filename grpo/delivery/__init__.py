"""Exactly-once delivery: the spool, the ledger and admission, published versions."""
