"""One run, whatever its layout: acme's ``ExperimentConfig`` for DreamerV3.

``make_experiment(run, config)`` is what the command line's flags
(``experiments.run_dmc.experiment_from_flags``) and ``run_dmc.train(
env_factory, ...)`` both produce, and what both layouts take: the
one-process ``experiments.layouts.local.Trainer(experiment)`` and the
Launchpad program ``experiments.layouts.distributed.launch.prepare(
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
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from agent.config import DreamerConfig
from agent.types import EnvSpaces, step_bytes
from experiments.envs import suites
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
