"""The sampling role, one job per module: data (the questions), weights (the versions),
episodes (the batches), the delivery endpoint (grpo.delivery.sampler_endpoint), loop (the run)."""
