"""Rewards from models, served over the project's transport: a third role (ROLE=reward) scores
answers with a reward model or an LLM judge for any number of samplers.

protocol  the messages and their checks (one module both ends import)
backends  what scores: a sequence-classification reward model, a generative judge
server    the role: batches requests, scores each answer once, replies
keys      the service's own CURVE key pair (a reward node never holds the trainer's)
client    the sampler's end: batched requests with a timeout and retries, and the weighted
          sum with the task's rule reward
"""
