"""Plugins defined outside grpo/, the way a user writes one: each is one file named in a config."""
