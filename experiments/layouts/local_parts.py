"""Every piece of the one-process run and the state they save (spec 6.1-6.5).

``LocalParts`` makes the pieces from the experiment's builder in the shape
of acme's ``LocalLayout`` (the wiring ``experiments.layouts.local`` draws),
restores them from a resume state, saves them in a checkpoint and closes
them. It starts empty and ``build`` fills it in order, so ``close`` releases
whatever a failed build made. The run's own jobs come in as hooks: where
learner and eval rows go, the row a persistent-skip stop writes, each
finished episode and the loop's stop poll (``experiments.layouts.local
.Trainer``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

import agent  # noqa: F401  (jax compat before acme)
from experiments.run import env_loop, health, metrics, rundir
from experiments.run.evaluator import Evaluator
from experiments.run.experiment import DreamerExperiment

MODE = 'single_process'


class LocalParts:
  """The pieces (module doc): ``env``, ``server`` / ``client``, ``adder``,
  ``dataset``, ``schedule``, ``networks``, ``counter``, ``learner``,
  ``health``, ``updates_runner``, ``actor``, ``agent``, ``evaluator``,
  ``episodes_observer`` and ``loop``; and the run's counts."""

  def __init__(self, experiment: DreamerExperiment):
    self.experiment = experiment
    self.run_config = experiment.run
    self.builder = experiment.builder
    (self.env, self.server, self.client, self.adder, self.dataset,
     self.schedule, self.keys, self.networks, self.counter, self.learner,
     self.health, self.updates_runner, self.actor, self.agent, self.evaluator,
     self.episodes_observer, self.loop) = (None,) * 17

  # -- construction -------------------------------------------------------------
  def build(self, segment: int, resumed: bool, *,
            logger: Callable[[], Any], on_skip_stop: Callable[[], None],
            on_episode: Callable[[Any], None],
            should_stop: Callable[[], bool]) -> None:
    """Makes the pieces; ``logger``: the run's metrics logger (learner and
    eval rows), ``on_skip_stop``: the row written before a persistent-skip
    stop, ``on_episode``: each finished training episode, ``should_stop``:
    polled by the loop between vector steps."""
    from acme.utils import counting

    from agent.builder import seed_keys
    from experiments.layouts.scheduled import (
        DreamerAgent, ScheduledUpdates, TrainSchedule)
    from experiments.run.config import segment_seed
    from reverb_tables import tables as tables_lib

    run, builder = self.run_config, self.builder
    c = self.experiment.config
    self.env = run.make_env(run.num_envs, segment_seed(c.seed, segment))
    reverb_root = rundir.reverb_dir(run.logdir)
    os.makedirs(reverb_root, exist_ok=True)
    # The layout adapts the builder's limiter: learner and actor share this
    # thread, so the band must hold the exact spec 6.1 schedule.
    tables = tables_lib.for_one_process(
        builder.make_replay_tables(), num_workers=run.num_envs,
        chunk_length=builder.chunk_length)
    self.server = tables_lib.make_server(tables, checkpoint_dir=reverb_root)
    self.client = self.server.localhost_client()
    if resumed:
      tables_lib.check_signatures(self.client.server_info(), tables, reverb_root)
    self.adder = builder.make_adder(self.client)
    self.dataset = builder.make_dataset_iterator(self.client)
    self.schedule = TrainSchedule(c)
    self.keys = seed_keys(c.seed)
    self.networks = builder.make_networks()
    self.counter = counting.Counter()
    self.learner = builder.make_learner(
        self.keys['learner'], self.networks, self.dataset, self.client,
        counting.Counter(self.counter, prefix='', time_delta=0.0),
        logger_fn=lambda: metrics.LearnerRows(logger, lambda: self.env_steps),
        log_every=run.learner_log_every)
    # train_ratio bounds the learner here: after each added transition the
    # schedule's due updates run, each gated on the limiter
    # (experiments.layouts.scheduled).
    rows = c.batch_size * (2 if run.prefetch else 1)
    # Persistent skipped updates stop the run (spec 4.9).
    self.health = health.SkipGuard(run.max_skipped_updates, run.logdir,
                                   on_stop=on_skip_stop)
    self.updates_runner = ScheduledUpdates(
        self.health.watch(self.learner), self.schedule,
        lambda: self.adder.num_items,
        lambda n: tables_lib.can_sample(self.client, n), rows)
    self.actor = builder.make_actor(
        self.keys['actor'], builder.make_policy(self.networks), self.adder,
        self.learner, on_add=self.updates_runner)
    self.agent = DreamerAgent(self.actor, self.learner, self.updates_runner)
    self.evaluator = Evaluator(run, builder, segment, self.learner,
                               self.keys['eval'], logger)
    self.episodes_observer = env_loop.EpisodeObserver(
        run.num_envs, on_episode=on_episode, env_step=lambda: self.env_steps)
    self.loop = env_loop.VectorEnvironmentLoop(
        self.env, self.agent, self.counter, observers=[self.episodes_observer],
        should_stop=should_stop)

  def restore(self, state: Dict[str, Any], resume_from: str) -> int:
    """Restores every piece from a resume state (learner TrainingState,
    latent store, adder counters, train schedule, counters, policy rng,
    eval schedule); returns the replay's item count, which must match."""
    s = state['learner']
    rundir.restore_learner(resume_from, self.learner, self.dataset, s,
                           adder=self.adder, schedule=self.schedule)
    self.actor.set_state(state['actors'][0])
    self.updates_runner.set_state(s)
    self.counter.restore(state['counter'])
    self.evaluator.set_state(state['evaluator'] or {})
    size = int(self.client.server_info()['uniform'].current_size)
    if size != self.adder.num_items:
      raise ValueError(f'the Reverb checkpoint holds {size} items but the '
                       f'run state expects {self.adder.num_items}; the '
                       'checkpoint directory is inconsistent')
    return size

  # -- counts ----------------------------------------------------------------------
  @property
  def agent_steps(self) -> int:
    """Transitions added to the replay (spec 6.1 step)."""
    return self.agent.num_transitions

  @property
  def env_steps(self) -> int:
    """Agent transitions x action repeat (spec 7.5 x-axis)."""
    return self.agent_steps * self.run_config.action_repeat

  @property
  def updates(self) -> int:
    return self.agent.num_updates

  @property
  def episodes(self) -> int:
    """Training episodes finished (the loop counter's count)."""
    return int(self.counter.get_counts().get('episodes', 0))

  # -- checkpoint -------------------------------------------------------------------
  def save(self, *, segment: int, wall_time: float, next_log: int,
           recent_scores: List[float]) -> str:
    """Atomic checkpoint of every piece and the run's state
    (experiments.run.rundir); returns the ckpt-* path."""
    self.adder.flush()
    run = self.run_config
    reverb_path = rundir.checkpoint_reverb(run.logdir, self.client)
    return rundir.write_checkpoint(
        run.logdir, self.agent_steps, reverb_path=reverb_path,
        learner_state=self.learner.save(), config=self.experiment.config,
        spaces=self.experiment.spaces, run=run, mode=MODE,
        adder_state=self.adder.get_state(), schedule=self.schedule,
        latent_store=self.dataset.latent_store,
        run_state=rundir.make_run_state(
            mode=MODE, segment=segment,
            counts={'actor_steps': self.agent_steps, 'env_steps': self.env_steps,
                    'episodes': self.episodes, 'learner_steps': self.updates},
            counter=self.counter.save(),
            learner={
                **self.updates_runner.get_state(),
                **rundir.sampler_state(self.dataset), 'wall_time': wall_time,
                'next_log': next_log},
            actors=[{'offset': 0, 'num_envs': run.num_envs,
                     'num_items': self.adder.num_items,
                     'num_online_items': self.adder.num_online_items,
                     **self.actor.get_state()}],
            evaluator=self.evaluator.get_state(),
            recent_scores=recent_scores))

  # -- close -------------------------------------------------------------------------
  def close(self, logger: Optional[Any] = None) -> None:
    """Closes whatever was built (also after a failed build), ``logger``
    (the run's metrics logger) in its turn."""
    for obj, method in ((self.dataset, 'close'), (logger, 'close'),
                        (self.adder, 'close'), (self.env, 'close'),
                        (self.evaluator, 'close'), (self.server, 'stop')):
      if obj is None:
        continue
      try:
        getattr(obj, method)()
      except Exception:  # noqa: BLE001  (e.g. the server is already down)
        pass
