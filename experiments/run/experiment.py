"""One run, whatever its layout: acme's ``ExperimentConfig`` for DreamerV3,
and the configs it is made of, from the command line's flags.

``make_experiment(run, config)`` is what the flags (``experiment_from_flags``,
the flags defined in ``experiments.options``) and ``run_dmc.train(
env_factory, ...)`` both produce, and what both layouts take: the one-process ``experiments.layouts.local.Trainer(experiment)`` and
the Launchpad program ``experiments.layouts.distributed.launch.prepare(
experiment, dist)``. It holds

  run      the run's task, env factory, budgets, cadences and seeds
           (``RunConfig``; the env factory: ``run.make_env``)
  config   the agent (``DreamerConfig``, spec hyperparameters)
  spaces   the env's spaces, read once from one env of the factory
  builder  the ``DreamerBuilder``, made here and only here: the network
           factory (``builder.make_networks``), the replay tables, adder,
           dataset, learner, policy and actors of every process come from it

As in acme, the experiment does not know its layout: the layout adapts what
the builder makes (the one-process replay limiter,
``reverb_tables.tables.for_one_process``) and adds its own settings
(``DistributedConfig``). ``join_workers`` is the one thing of a layout the
builder must know at construction: remote actors' env workers widen the
step-id layout and the latent store (spec 5.9).

From flags (``configs_from_flags``): the ``CONFIG_FLAGS`` become the
DreamerConfig fields of their names (``--train_ratio`` ->
``DreamerConfig.train_ratio`` -> the builder's rate limiter, spec 6.1), the
rest the ``RunConfig`` and, with ``--distributed``, the program's
``DistributedConfig``. Each raises ValueError naming the flag; the rules
themselves live where ``experiments.options`` says.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Tuple

import numpy as np
from absl import flags

from agent.config import DreamerConfig, make_config
from agent.types import EnvSpaces, step_bytes
from experiments.config_overrides import parse_overrides
from experiments.envs import suites
from experiments.layouts.distributed.settings import DistributedConfig
from experiments.options import (
    CONFIG_FLAGS, DIST_FLAG_NAMES, FLAG_NAMES, FLAGGED_FIELDS)
from experiments.run.config import RunConfig, segment_seed


@dataclasses.dataclass(frozen=True)
class DreamerExperiment:
  """What a run is (module doc); ``make_experiment`` builds it."""
  run: RunConfig
  config: DreamerConfig
  spaces: EnvSpaces
  builder: object            # agent.builder.DreamerBuilder

  @property
  def seed(self) -> int:
    return self.config.seed


# Agent steps of the probe episode make_experiment runs (or fewer, when the
# episode ends first).
PROBE_STEPS = 32


def make_experiment(run: RunConfig, config: DreamerConfig,
                    join_workers: int = 0) -> DreamerExperiment:
  """The experiment of ``run`` and ``config``. One env is made for its
  spaces, reset and stepped with a neutral action (zeros, or index 0) to the
  end of its first episode or ``PROBE_STEPS`` steps, then closed: an env the
  agent cannot take, or whose first observations are non-finite or wrongly
  shaped, fails here (``experiments.envs.protocol``, naming the key), before
  the layout makes the run directory. Then the replay's memory is fitted to
  the machine (``fit_replay``)."""
  env = run.make_env(1, segment_seed(0, 0))
  try:
    spaces = env.spaces
    action = (np.zeros((1,), np.int64) if spaces.discrete else
              np.zeros((1, spaces.act_dim)))
    step = env.reset()
    for _ in range(PROBE_STEPS):
      if step.observation['is_last'].all():
        break
      step = env.step(action)
  finally:
    env.close()
  config = fit_replay(run, config, spaces, memory_bytes())
  return experiment_of(run, config, spaces, join_workers)


# The share of the machine's memory the replay may hold; the rest is the
# learner's, the envs' and the system's.
REPLAY_MEMORY_SHARE = 0.5


def memory_bytes() -> int:
  """The machine's memory (MemTotal: the same at every start on one
  machine, so a resumed run fits its replay as it did before)."""
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def fit_replay(run: RunConfig, config: DreamerConfig, spaces: EnvSpaces,
               memory: int) -> DreamerConfig:
  """The replay holds at most min(capacity, the run's agent steps) steps of
  ``step_bytes`` each (spec 5.1; images make that 12 KB a step). When that
  exceeds REPLAY_MEMORY_SHARE of ``memory``: the spec's default capacity
  shrinks to what fits (a pixel run's default, said in one line); a capacity
  the user chose is a ValueError naming the estimate, before anything is
  written. The estimate is the uncompressed size: Reverb's chunk compression
  makes the real footprint smaller (docs/metrics.md), never larger."""
  per_step = step_bytes(spaces, config)
  steps = run.env_steps // run.action_repeat + run.num_envs
  peak = min(config.replay_capacity, steps) * per_step
  budget = int(REPLAY_MEMORY_SHARE * memory)
  if peak <= budget:
    return config
  fits = max(config.batch_size * config.seq_len, budget // per_step)
  gib = 1 << 30
  what = (f'{min(config.replay_capacity, steps):,} steps x {per_step:,} B = '
          f'{peak / gib:.1f} GiB, over {REPLAY_MEMORY_SHARE:.0%} of this '
          f'machine\'s {memory / gib:.1f} GiB')
  default = DreamerConfig.__dataclass_fields__['replay_capacity'].default
  if config.replay_capacity != default:
    raise ValueError(f'--replay_capacity {config.replay_capacity:,} would hold '
                     f'{what}; give at most {fits:,} (or fewer --env_steps)')
  print(f'[replay] capacity {fits:,} steps (the default would hold {what})',
        flush=True)
  return config.replace(replay_capacity=int(fits))


def experiment_of(run: RunConfig, config: DreamerConfig, spaces: EnvSpaces,
                  join_workers: int = 0) -> DreamerExperiment:
  """The experiment for known ``spaces`` (another host's settings,
  ``ProgramSettings.from_json``): no env is made."""
  from agent.builder import DreamerBuilder
  from agent.types import step_bounds

  builder = DreamerBuilder(
      config, spaces, num_envs=run.num_envs, chunk_length=run.chunk_length,
      eval_policy=run.eval_policy, prefetch=run.prefetch,
      learner_devices=run.learner_devices, policy_device=run.policy_device,
      join_workers=join_workers, step_bounds=step_bounds(
          spaces, config,
          reward=suites.reward_range(run.suite, run.task,
                                     run.action_repeat),
          value_limit=run.replay_value_limit))
  return DreamerExperiment(run=run, config=config, spaces=spaces,
                           builder=builder)


# -- from flags --------------------------------------------------------------
def configs_from_flags(fv: flags.FlagValues = flags.FLAGS
                       ) -> Tuple[RunConfig, DreamerConfig,
                                  Optional[DistributedConfig]]:
  """(RunConfig, DreamerConfig, DistributedConfig or None without
  --distributed) from parsed flags; ValueError names the flag."""
  kw = {name: fv[name].value for name in CONFIG_FLAGS}   # train_ratio, ...
  kw['train_fill'] = fv.train_fill or fv.batch_size * fv.batch_length
  kw.update(parse_overrides(fv.config_overrides, FLAGGED_FIELDS))
  try:
    config = make_config(**kw)
  except ValueError as e:
    raise ValueError(f'invalid configuration from flags: {e}') from e
  names = FLAG_NAMES + (DIST_FLAG_NAMES if fv.distributed else ())
  text = ''.join(fv[name].serialize() + '\n' for name in names
                 if fv[name].serialize())
  logdir = os.path.abspath(os.path.expanduser(fv.logdir))
  run = RunConfig(
      suite=fv.suite, task=fv.task, logdir=logdir,
      env_steps=fv.env_steps, num_envs=fv.num_envs,
      action_repeat=fv.action_repeat, eval_every=fv.eval_every,
      eval_episodes=fv.eval_episodes, eval_policy=fv.eval_policy,
      checkpoint_every=fv.checkpoint_every, log_every=fv.log_every,
      learner_log_every=fv.learner_log_every,
      progress_every=fv.progress_every, time_limit=fv.time_limit,
      image=fv.image, proprio=fv.proprio,
      chunk_length=fv.chunk_length or None, prefetch=fv.learner_prefetch,
      report=fv.report, jax_cache_dir=jax_cache_dir(fv, logdir),
      learner_devices=fv.learner_devices, policy_device=fv.policy_device,
      max_skipped_updates=fv.max_skipped_updates,
      replay_value_limit=fv.replay_value_limit, flags_text=text)
  dist = None
  if fv.distributed:
    dist = DistributedConfig(
        num_actors=fv.num_actors, update_period=fv.actor_update_period,
        terminal=fv.lp_terminal, stop_grace_s=fv.stop_grace,
        max_restarts=fv.max_restarts,
        learner_processes=fv.learner_processes,
        coordinator_address=fv.coordinator_address,
        remote_learner_processes=fv.remote_learner_processes,
        join_slots=fv.join_slots, join_port=fv.join_port, bind=fv.bind,
        join_lease_s=fv.join_lease, join_max_envs=fv.join_max_envs,
        join_secret_file=(os.path.abspath(os.path.expanduser(
            fv.join_secret_file)) if fv.join_secret_file else ''),
        isolation=fv.isolation)
  elif fv.learner_processes != 1:
    raise ValueError('--learner_processes needs --distributed (the learner '
                     'processes are nodes of the Launchpad program)')
  elif (fv.join_slots or fv.join_port or fv.bind or fv.join_max_envs or
        fv.join_secret_file or fv.remote_learner_processes):
    raise ValueError('--join_slots, --join_port, --bind, --join_max_envs, '
                     '--join_secret_file and --remote_learner_processes need '
                     '--distributed (they are settings of the Launchpad '
                     'program)')
  return run, config, dist


def experiment_from_flags(fv: flags.FlagValues = flags.FLAGS
                          ) -> Tuple[DreamerExperiment,
                                     Optional[DistributedConfig]]:
  """(the experiment, the Launchpad program's settings or None without
  --distributed) from parsed flags: what both layouts take; ValueError
  names the flag."""
  run, config, dist = configs_from_flags(fv)
  return make_experiment(run, config, join_workers(dist)), dist


def join_workers(dist: Optional[DistributedConfig]) -> int:
  """Env workers the builder reserves for remote actors (``--join_slots``)."""
  return dist.join_slots if dist is not None else 0


def jax_cache_dir(fv: flags.FlagValues, logdir: str) -> Optional[str]:
  """--jax_cache_dir: default <logdir>/jax_cache; 'off' -> None."""
  value = fv.jax_cache_dir
  if value == 'off':
    return None
  return os.path.abspath(os.path.expanduser(value or os.path.join(logdir,
                                                                  'jax_cache')))
