"""weights.mode collective: each version broadcast to the samplers in a process group of their
own (group.py: the group and its wire; broadcaster.py: the trainer's end; member.py: a
sampler's; membership.py: who is in it), never hanging the trainer (docs/weights.md)."""
