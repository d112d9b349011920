"""The config's checks: each section's own (`check_<section>`, beside the section's class, which
reads that section alone), then here the rules that read several sections at once, and what a
config resolves to where more than one section decides it. Above every section's module, which
imports none of this. (Every wait's bounds: grpo.config.bounds; names that pick an
implementation, which need the registries: grpo.plan.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpo.config.algo import check_algo, check_correction
from grpo.config.data import check_rows
from grpo.config.engines import BUILT_IN, abilities
from grpo.config.errors import ConfigError
from grpo.config.sampling import check_data, check_reward, check_reward_server, check_rollout
from grpo.config.sections import check_eval
from grpo.config.teacher import OPD, SERVICE
from grpo.config.train import check_critic, check_train
from grpo.config.transport import check_transport
from grpo.config.weights import check_weights
from grpo.core.vocabulary import GAE, parse_correction

if TYPE_CHECKING:
    from grpo.config.sections import Config


def check_values(cfg: Config) -> None:
    """Refuse values that are well-typed but unusable, saying how to fix them (types and
    unknown keys are grpo.config.loading's job): each section's own, then the rules across."""
    check_name(cfg.name)
    check_data(cfg.data)
    check_rows(cfg.rows)
    check_reward(cfg.reward)
    check_reward_server(cfg.reward_server)
    check_rollout(cfg.rollout)
    check_algo(cfg.algo)
    check_train(cfg.train)
    check_critic(cfg.critic)
    check_eval(cfg.eval)
    check_transport(cfg.transport)
    _check_batch(cfg)
    _check_delivery(cfg)
    check_continuous(cfg)
    check_eval_engine(cfg)
    # Continuous generation records every token's log-prob, whichever engine samples it.
    logprobs = abilities(cfg.rollout.backend).reports_logprobs or cfg.rollout.mode == "continuous"
    check_correction(cfg.algo, engine_logprobs=logprobs)
    check_weights(cfg)
    check_teacher(cfg)


# What output_dir holds beside the runs: the embedded model's conversion, and every run's spools.
RESERVED_NAMES = ("base", "base.lock", "spool")


def check_name(name: str) -> None:
    """The run's name is its dir under output_dir, which a new run moves aside: one path
    component, and none of output_dir's own entries (name=base moved the embedded model aside,
    name=../x any directory)."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or len(name) > 200:
        raise ConfigError(
            "name must be one path component (no '/', not '.' or '..', 1-200 "
            "characters): outputs go to output_dir/<name>; got "
            f"{name!r:.80}"
        )
    if name in RESERVED_NAMES:
        raise ConfigError(
            f"name {name!r} is output_dir's own ({', '.join(RESERVED_NAMES)} are "
            "reserved): pick another run name"
        )


def _check_batch(cfg: Config) -> None:
    """The batch, its answers and its split across the trainer's ranks."""
    algo, r, t = cfg.algo, cfg.rollout, cfg.train
    if not 0 <= algo.overlong_buffer <= r.max_new_tokens:
        raise ConfigError(
            f"algo.overlong_buffer must be in [0, rollout.max_new_tokens="
            f"{r.max_new_tokens}], got {algo.overlong_buffer}"
        )
    if algo.advantage == GAE and cfg.critic.warmup_steps >= t.total_steps:
        raise ConfigError(
            f"critic.warmup_steps ({cfg.critic.warmup_steps}) >= train.total_steps "
            f"({t.total_steps}): the policy would never train"
        )
    batch_seqs = r.questions_per_step * r.group_size
    mini = t.mini_batch_size
    if mini and (mini < 0 or batch_seqs % mini or mini % cfg.world):
        raise ConfigError(
            f"train.mini_batch_size ({mini}) must divide the batch ({batch_seqs} sequences) and "
            f"be a multiple of the trainer's ranks ({cfg.world}); 0 = the whole batch"
        )
    if r.questions_per_step % cfg.world:
        raise ConfigError(
            f"rollout.questions_per_step ({r.questions_per_step}) must be a multiple "
            f"of the trainer's ranks, train.nnodes x train.num_ranks ({cfg.world}): each rank "
            "trains on whole groups"
        )


def _check_delivery(cfg: Config) -> None:
    """The sampler's spool against the trainer's acknowledgements; the reward service's address
    against the transport's."""
    r, t = cfg.rollout, cfg.train
    # Batches are acknowledged when a training state is saved; until then they stay spooled.
    unacked = (t.state_interval or t.total_steps) + t.max_staleness + 1
    if r.spool_max_batches < unacked:
        raise ConfigError(
            f"rollout.spool_max_batches ({r.spool_max_batches}) must be at least "
            f"train.state_interval + train.max_staleness + 1 = {unacked}, or the sampler would "
            "wait for acknowledgements that only a state save sends: raise it or save the state "
            "more often"
        )
    addr, tr = cfg.reward.service_addr, cfg.transport
    if addr and addr in (tr.episodes_addr, tr.control_addr, tr.weights_addr):
        raise ConfigError(f"reward.service_addr {addr} is a transport.* address too")


def check_continuous(cfg: Config) -> None:
    """rollout.mode: continuous's limits (ConfigError, one line)."""
    r = cfg.rollout
    if r.mode != "continuous":
        return
    if not abilities(r.backend).continuous:
        able = [name for name, a in BUILT_IN.items() if a.continuous]
        raise ConfigError(
            f"rollout.mode=continuous needs an engine written to slots whose factory declares "
            f"EngineAbilities(continuous=True) ({', '.join(able)}, or your own): not {r.backend!r}"
        )
    if r.dynamic_sampling:
        raise ConfigError(
            "rollout.mode=continuous cuts batches in admission order, without dynamic_sampling: "
            "set rollout.dynamic_sampling=false"
        )
    # With a lag, an answer's tokens come from several versions, none of them the old policy
    # the loss's ratio is taken against: each token needs its own behaviour weight.
    weight_mode, _ = parse_correction(cfg.algo.rollout_correction)
    if cfg.train.max_staleness and weight_mode == "none":
        raise ConfigError(
            f"rollout.mode=continuous with train.max_staleness={cfg.train.max_staleness} "
            "samples an answer with several versions: set algo.rollout_correction=decoupled "
            "(or another weight mode) so each token is weighted by its own behaviour log-prob"
        )


def eval_engine(cfg: Config) -> str:
    """Who generates the evaluation's answers: eval.engine, with auto resolved ("sampler" where
    the sampler can answer, see `sampler_cannot_answer`, else "trainer")."""
    e = cfg.eval
    if e.engine == "auto":
        return "trainer" if sampler_cannot_answer(cfg) else "sampler"
    return e.engine


def sampler_cannot_answer(cfg: Config) -> list[str]:
    """Why the sampler cannot answer the evaluation ([] if it can): the one sampler answers
    each due version when it loads it, which it does for every version, in order, only when it
    samples lock-step, alone, on-policy, and each due version is published."""
    e, r, t = cfg.eval, cfg.rollout, cfg.train
    unmet = [
        f"{key}={value} (needs {want})"
        for key, value, want in (
            ("rollout.mode", r.mode, "lockstep"),
            ("rollout.num_samplers", r.num_samplers, 1),
            ("train.max_staleness", t.max_staleness, 0),
        )
        if value != want
    ]
    if e.interval % t.sync_interval:
        unmet.append(
            f"eval.interval={e.interval} (needs a multiple of train.sync_interval="
            f"{t.sync_interval}: only published versions reach the sampler)"
        )
    return unmet


def check_eval_engine(cfg: Config) -> None:
    """eval.engine: sampler's limits (ConfigError, one line); auto takes the trainer there."""
    if cfg.eval.engine == "sampler" and (unmet := sampler_cannot_answer(cfg)):
        raise ConfigError(f"eval.engine=sampler: {'; '.join(unmet)}; or set eval.engine=auto")


def serves_teacher(cfg: Config) -> bool:
    """Whether the reward service (ROLE=reward) loads the teacher and serves its log-probs."""
    return bool(cfg.teacher.path) and cfg.teacher.where == SERVICE


def service_scores(cfg: Config) -> bool:
    """Whether the samplers ask the reward service for scores: whenever reward.service_addr is
    set, except for a service that serves the teacher alone (no reward_server.backend)."""
    return bool(cfg.reward.service_addr) and (
        bool(cfg.reward_server.backend) or not serves_teacher(cfg)
    )


def check_teacher(cfg: Config) -> None:
    """ConfigError, one line, when algo.advantage=opd has no teacher or its weight is bad, or
    a served teacher has no service to run in."""
    algo, t = cfg.algo, cfg.teacher
    if algo.opd_reward_weight < 0:
        raise ConfigError(f"algo.opd_reward_weight must be >= 0, got {algo.opd_reward_weight!r}")
    if algo.advantage == OPD and not t.path:
        raise ConfigError(
            "algo.advantage=opd needs a teacher: set teacher.path (an HF model dir or "
            "'embedded') whose per-token log-probs the student's answers are scored by"
        )
    if t.max_tokens < 2:
        raise ConfigError(f"teacher.max_tokens must be >= 2, got {t.max_tokens!r}")
    if t.where == SERVICE and t.path and not cfg.reward.service_addr:
        raise ConfigError(
            "teacher.where=service needs reward.service_addr: the reward service (ROLE=reward) "
            "that loads teacher.path and that the samplers ask, e.g. tcp://teacher-node:5560"
        )
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if serves_teacher(cfg) and t.max_tokens < longest:
        raise ConfigError(
            f"teacher.max_tokens={t.max_tokens} is below data.max_prompt_tokens + "
            f"rollout.max_new_tokens ({longest}): the service would refuse the longest answers"
        )
