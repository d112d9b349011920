"""Per-token log-probs: chunked kernels, the model forwards, scoring whole batches."""
