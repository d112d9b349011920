"""Plain data both roles share: episodes and batches, and their tensor layout."""
