"""The sampling role, one job per module: data (the questions), weights (the versions),
episodes (the batches), outbox (their delivery), loop (the run)."""
