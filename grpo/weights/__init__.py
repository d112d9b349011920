"""How versions travel from the trainer to the samplers: the home of the weight path.

    dirs.py         version dirs in a run dir: published whole (rename, then LATEST), checked
                    file by file (weights.mode shared_dir; files copies them over ZeroMQ)
    stream/         versions from memory (weights.mode stream): the image and its manifest
                    (image, frames, deltas, torch_bits), the trainer's server, a sampler's
                    receiver, relays and the follower that picks a source
    collective/     weights.mode collective: a process group of its own (torch.distributed)
                    between trainer rank 0 and the samplers; rides on stream for what a
                    broadcast cannot do (catching up, resuming, the root of trust)

See docs/weights.md for the modes and what each end checks.
"""
