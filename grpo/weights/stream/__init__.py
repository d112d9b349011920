"""weights.mode stream: versions served from the trainer's memory, bucket by bucket, checked
against the manifest identity the trainer announced (docs/weights.md)."""
