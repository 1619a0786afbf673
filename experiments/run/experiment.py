"""One run, whatever its layout: acme's ``ExperimentConfig`` for DreamerV3.

``make_experiment(run, config)`` is what the flags (``experiments.options``)
and ``run_dmc.train(env_factory, ...)`` both produce, and what both layouts
take: the one-process ``experiments.layouts.local.Trainer(experiment)`` and
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
"""

from __future__ import annotations

import dataclasses

from agent.config import DreamerConfig
from agent.types import EnvSpaces
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


def make_experiment(run: RunConfig, config: DreamerConfig,
                    join_workers: int = 0) -> DreamerExperiment:
  """The experiment of ``run`` and ``config``: one env is made and closed
  for its spaces first, so an env the agent cannot take fails here, before
  anything is written (``experiments.envs.protocol``)."""
  env = run.make_env(1, segment_seed(0, 0))
  spaces = env.spaces
  env.close()
  return experiment_of(run, config, spaces, join_workers)


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
