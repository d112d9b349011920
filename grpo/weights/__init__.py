"""How versions travel from the trainer to the samplers.

weights.mode collective lives here: a process group of its own (torch.distributed) between
trainer rank 0 and the samplers, each version broadcast bucket by bucket (grpo.weights.group
for the group and the wire, grpo.weights.broadcaster for the trainer's end,
grpo.weights.member for a sampler's). The other modes (shared_dir, files, stream) still live
in grpo.delivery and grpo.wire; collective rides on stream for what a broadcast cannot do
(catching up, resuming, the root of trust), see docs/weights.md.
"""
