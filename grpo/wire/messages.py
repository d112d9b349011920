"""The kinds of control message, and the stop reasons a role acts on, as names.

Control channel (trainer PUB -> samplers; samplers PUSH -> trainer):
    HEARTBEAT  either way, every transport.heartbeat_s: liveness, the published version,
               acknowledgements and the batches trained so far
    VERSION    trainer: version v is published (sent at once, not only in the next heartbeat)
    DONE       trainer: the run is complete
    STOP       either way: the sender is stopping, with a reason
    REJECTED   trainer: a batch was dropped as unfit, the reason sealed for its sender (who stops)
    BYE        sampler: it has everything it needs (the trainer may stop serving weights)
    EVAL       sampler: its answers to the evaluation of the version the trainer's heartbeats
               ask for (eval.engine: sampler)
Weight stream (sampler REQ -> trainer ROUTER): MANIFEST, CHUNK requests and their replies,
MISSING when a version or file cannot be served.
"""

HEARTBEAT = "heartbeat"
VERSION = "version"
DONE = "done"
STOP = "stop"
REJECTED = "rejected"
BYE = "bye"
EVAL = "eval"

MANIFEST = "manifest"
CHUNK = "chunk"
MISSING = "missing"

# Stop reasons that mean the trainer is the one that went away: a sampler stopping for one of
# them does not send its own stop back.
TRAINER_STOPPED = "trainer stopped"
TRAINER_SILENT = "no heartbeat from the trainer"
INTERRUPTED = "interrupted"
# How a sampler's stop begins when the run's input stopped it (its reward failing past
# reward.max_error_rate): the trainer then ends with exit 2 too, which launch.sh never restarts.
INPUT_STOPPED = "stopped by the run's input"
