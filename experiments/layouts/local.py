"""The single-process, resumable DreamerV3 run (Algorithm K, spec 6.1-6.5, 7.1-7.5).

``Trainer(experiment).run()`` wires one process from Acme parts, in the
shape of acme's ``LocalLayout`` (the experiment's builder makes every piece,
``experiments.run.experiment``):

  env      = VectorEnv(task, N)          # N envs as one dm_env.Environment
  server   = Reverb server with builder.make_replay_tables() (uniform +
             online), the uniform table's limiter adapted to one process
             (``reverb_tables.tables.for_one_process``)
  schedule = builder.make_train_schedule()              # spec 6.1, 6.2
  updates  = ScheduledUpdates(learner, schedule, ...)   # the actor's on_add
  actor    = builder.make_actor(..., on_add=updates)
  agent    = DreamerAgent(actor, learner, updates)      # acme Actor
  loop     = VectorEnvironmentLoop(env, agent, counter, observers=[episodes])
  loop.run()                                            # acme.EnvironmentLoop

Per vector step the loop asks the actor for N actions (one jitted policy
call), steps the envs and hands the timestep to ``agent.observe``: the actor
adds the N steps one env at a time and after each one ``updates`` runs the
spec 6.1 schedule (learner steps with latent write-back); ``agent.update()``
then gives the actor the current params. The learner's dataset samples one
batch ahead (spec 6.3b; ``--nolearner_prefetch`` keeps the strict order):
docs/deviations.md "Training loop".

Between vector steps the loop polls ``Trainer._tick``: metrics rows, evals,
checkpoints, the progress line and the stop conditions (the step budget, a
SIGINT/SIGTERM). Run management (run directory, checkpoints, metric rows,
evaluation) is ``experiments.run``, shared with the Launchpad layout.

Resume: a start whose logdir holds a complete checkpoint continues from it
(learner TrainingState, latent store, Reverb tables and limiter, adder
counters, train schedule, counters, policy rng, eval schedule). Envs restart
their episodes (open episodes at the checkpoint are dropped; env seeds move to
a new segment so episodes are not replayed).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List

import agent  # noqa: F401  (jax compat before acme)
from experiments.layouts import stopping
from experiments.run import env_loop, health, metrics, rundir
from experiments.run.config import (
    enable_compilation_cache, log, next_multiple, segment_seed)
from experiments.run.evaluator import Evaluator
from experiments.run.experiment import DreamerExperiment

MODE = 'single_process'


class Trainer:
  """One single-process DreamerV3 run (see module doc).

  ``Trainer(experiment)`` only validates (--logdir, resume compatibility)
  and touches nothing; ``run()`` builds, trains to ``run.env_steps``,
  evaluates, checkpoints and reports; ``close()`` releases the server and
  envs.
  """

  def __init__(self, experiment: DreamerExperiment):
    self.experiment = experiment
    run = self.run_config = experiment.run
    self.config = experiment.config
    self.logdir = run.logdir
    self._resume_from = rundir.validate(run, self.config, MODE)
    self._closed = False
    self._signals = stopping.SignalStop()
    self._built = False

  def _log(self, msg: str) -> None:
    if self.run_config.verbose:
      log(msg)

  # -- construction --------------------------------------------------------------
  def _build(self) -> None:
    from acme.utils import counting

    from agent.builder import seed_keys
    from experiments.layouts.scheduled import DreamerAgent, ScheduledUpdates
    from reverb_tables import tables as tables_lib

    run, c = self.run_config, self.config
    if run.jax_cache_dir:
      enable_compilation_cache(run.jax_cache_dir)
    state = rundir.load_resume_state(run, self._resume_from)
    self.segment = state['segment'] + 1 if state else 0
    self.env = run.make_env(run.num_envs, segment_seed(c.seed, self.segment))
    self.spaces = self.experiment.spaces
    self.builder = self.experiment.builder
    reverb_root = rundir.reverb_dir(self.logdir)
    os.makedirs(reverb_root, exist_ok=True)
    # The layout adapts the builder's limiter: learner and actor share this
    # thread, so the band must hold the exact spec 6.1 schedule.
    tables = tables_lib.for_one_process(
        self.builder.make_replay_tables(), num_workers=run.num_envs,
        chunk_length=self.builder.chunk_length)
    self.server = tables_lib.make_server(tables, checkpoint_dir=reverb_root)
    self.client = self.server.localhost_client()
    if state:
      tables_lib.check_signatures(self.client.server_info(), tables, reverb_root)
    self.adder = self.builder.make_adder(self.client)
    self.dataset = self.builder.make_dataset_iterator(self.client)
    self.schedule = self.builder.make_train_schedule()
    self.keys = seed_keys(c.seed)
    self.networks = self.builder.make_networks()
    self.counter = counting.Counter()
    self.learner = self.builder.make_learner(
        self.keys['learner'], self.networks, self.dataset, self.client,
        counting.Counter(self.counter, prefix='', time_delta=0.0),
        logger_fn=lambda: metrics.LearnerRows(lambda: self.logger,
                                              lambda: self.env_steps),
        log_every=run.learner_log_every)
    # train_ratio bounds the learner here: after each added transition the
    # schedule's due updates run, each gated on the limiter
    # (experiments.layouts.scheduled).
    rows = c.batch_size * (2 if run.prefetch else 1)
    # Persistent skipped updates stop the run (spec 4.9).
    self.health = health.SkipGuard(run.max_skipped_updates, self.logdir,
                                   on_stop=self._write_row)
    self.updates_runner = ScheduledUpdates(
        self.health.watch(self.learner), self.schedule,
        lambda: self.adder.num_items,
        lambda n: tables_lib.can_sample(self.client, n), rows)
    self.actor = self.builder.make_actor(
        self.keys['actor'], self.builder.make_policy(self.networks), self.adder,
        self.learner, on_add=self.updates_runner)
    self.agent = DreamerAgent(self.actor, self.learner, self.updates_runner)
    self.evaluator = Evaluator(run, self.builder, self.segment, self.learner,
                               self.keys['eval'], lambda: self.logger)
    self.episodes_observer = env_loop.EpisodeObserver(
        run.num_envs, on_episode=self._record_episode,
        env_step=lambda: self.env_steps)
    self.loop = env_loop.VectorEnvironmentLoop(
        self.env, self.agent, self.counter, observers=[self.episodes_observer],
        should_stop=self._tick)

    self.wall_time = self._t_eval = self._t_ckpt = 0.0
    self.recent_scores: List[float] = []
    if state:
      s = state['learner']
      rundir.restore_learner(self._resume_from, self.learner, self.dataset, s,
                             adder=self.adder, schedule=self.schedule)
      self.actor.set_state(state['actors'][0])
      self.updates_runner.set_state(s)
      self.counter.restore(state['counter'])
      self.wall_time = s['wall_time']
      self.evaluator.set_state(state['evaluator'] or {})
      self.recent_scores = list(state['recent_scores'])
      size = int(self.client.server_info()['uniform'].current_size)
      if size != self.adder.num_items:
        raise ValueError(f'the Reverb checkpoint holds {size} items but the '
                         f'run state expects {self.adder.num_items}; the '
                         'checkpoint directory is inconsistent')
      self._log(f'[run] resumed from {self._resume_from} (segment '
                f'{self.segment}): {metrics.fmt_steps(self.env_steps)} env '
                f'steps, {self.updates} updates, {size} replay items')
    # Log / eval grids follow the current flags (they may change on resume).
    self.next_log = next_multiple(self.env_steps, run.log_every)
    self.next_eval = (next_multiple(self.env_steps, run.eval_every)
                      if run.eval_every else None)
    rundir.start_segment(run, state)   # validated: now the logdir may change
    self.logger = metrics.RunLogger(self.logdir)
    self._built = True

  # -- counts ------------------------------------------------------------------------
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

  @property
  def done(self) -> bool:
    return stopping.budget_reached(self.env_steps, self.run_config.env_steps)

  # -- main loop ---------------------------------------------------------------------
  def run(self) -> Dict[str, Any]:
    """Trains to ``env_steps`` (or a stop signal, ``stopping.SignalStop``);
    returns a summary dict."""
    if not self._built:
      self._build()
    with self._signals:
      return self._run()

  def _run(self) -> Dict[str, Any]:
    run = self.run_config
    self._t_start, self._wall0 = time.perf_counter(), self.wall_time
    self._last_ckpt = self._last_progress = time.perf_counter()
    self._eta = metrics.Eta()
    self._row_scores, self._row_lengths = [], []
    self._last_row_step = None
    self._row_mark = self._tally()
    self._log(f'[run] {run.task} size={self.config.size} envs={run.num_envs} '
              f'repeat={run.action_repeat} train_ratio={self.config.train_ratio:g} '
              f'B={self.config.batch_size} T={self.config.batch_length} '
              f'target={metrics.fmt_steps(run.env_steps)} env steps, '
              f'logdir={self.logdir}')
    worked = not self.done
    if worked:
      self.loop.run()
    stopped = self._signals.requested
    if worked or stopped:
      if not stopped:
        if self._final_eval_due():
          self.evaluate()
        if self._last_row_step != self.env_steps:
          self._write_row()
      self._update_wall()
      self.save_checkpoint()
    else:
      self._log(f'[run] {self.logdir} already reached '
                f'{metrics.fmt_steps(self.env_steps)} env steps; nothing to train')
    self._progress(final=True)
    if stopped:
      self._log(f'[run] stopped by signal {self._signals.signum}; checkpoint saved, '
                'rerun the same command to resume')
    return {
        'env_steps': self.env_steps, 'agent_steps': self.agent_steps,
        'updates': self.updates, 'episodes': self.episodes,
        'recent_scores': list(self.recent_scores), 'stopped': stopped,
        'wall_time': self.wall_time,
        'update_cache_size': self.learner.update_cache_size(),
    }

  def _update_wall(self) -> None:
    self.wall_time = self._wall0 + time.perf_counter() - self._t_start

  def _tick(self) -> bool:
    """Polled by the loop between vector steps: rows, evals, checkpoints,
    progress; True stops the loop (budget reached or a stop signal)."""
    run = self.run_config
    self._update_wall()
    if self.env_steps >= self.next_log:
      self._write_row()
      self.next_log = next_multiple(self.env_steps, run.log_every)
    if self.next_eval is not None and self.env_steps >= self.next_eval:
      self.evaluate()
      self.next_eval = next_multiple(self.env_steps, run.eval_every)
    now = time.perf_counter()
    if now - self._last_ckpt >= run.checkpoint_every:
      self.save_checkpoint()
      self._last_ckpt = time.perf_counter()
    if now - self._last_progress >= run.progress_every:
      self._progress(final=False)
      self._last_progress = now
    return self.done or self._signals.requested

  def _final_eval_due(self) -> bool:
    """An eval at the end unless one ran less than eval_every / 2 ago."""
    run = self.run_config
    if not run.eval_episodes:
      return False
    last = self.evaluator.last_eval_step
    if last is None or not run.eval_every:
      return last != self.env_steps
    return self.env_steps - last >= run.eval_every / 2

  # -- episodes / rows -------------------------------------------------------------
  def _record_episode(self, ep) -> None:
    rundir.append_score(self.logdir, self.run_config.task, ep.env_step,
                         ep.score, self.config.seed, ep.stats)
    self.recent_scores = (self.recent_scores + [ep.score])[-5:]
    self._row_scores.append(ep.score)
    self._row_lengths.append(ep.length)

  def _tally(self) -> metrics.Tally:
    return metrics.learner_tally(
        env_steps=self.env_steps, agent_steps=self.agent_steps,
        updates=self.updates, episodes=self.episodes,
        server_info=self.client.server_info(), dataset=self.dataset,
        learner_timings=self.learner.timings,
        parts={'env': self.env.step_s, 'policy': self.actor.timings['policy_s'],
               'replay_add': self.actor.timings['add_s'],
               'eval': self._t_eval, 'checkpoint': self._t_ckpt})

  def _write_row(self) -> None:
    now = self._tally()
    row = metrics.train_row(
        now, self._row_mark, config=self.config, segment=self.segment,
        wall_time=self.wall_time, scores=self._row_scores,
        lengths=self._row_lengths, other_part=True,
        learner_metrics=self.learner.pop_metric_means(),
        extra={'replay/items': self.adder.num_items,
               'replay/online_items': self.adder.num_online_items,
               'replay/owed_updates': self.agent.owed_updates,
               **self.health.row()})
    self.logger.write(row)
    self._last_row_step = self.env_steps
    self._row_scores, self._row_lengths = [], []
    self._row_mark = now

  def _progress(self, final: bool) -> None:
    recent = getattr(self, '_prog_mark', None)
    now = time.perf_counter()
    if recent is None or final:
      fps = self.env_steps / max(self.wall_time, 1e-9)
    else:
      fps = (self.env_steps - recent[1]) / max(now - recent[0], 1e-9)
    self._prog_mark = (now, self.env_steps)
    self._eta.mark(self.wall_time, self.env_steps, training=self.updates > 0)
    self._log(metrics.progress_line(
        self.env_steps, self.run_config.env_steps, self.updates, fps,
        self.wall_time, self.recent_scores, final=final,
        eta=self._eta.seconds_left(self.env_steps, self.run_config.env_steps)))

  # -- evaluation (spec 7.3) ------------------------------------------------------------
  def evaluate(self) -> Dict[str, Any]:
    """One episode in each of ``eval_episodes`` separate envs (spec 7.3)."""
    if not self.run_config.eval_episodes:
      return {}
    t0 = time.perf_counter()
    row = self.evaluator.evaluate(self.env_steps, updates=self.updates)
    self._t_eval += time.perf_counter() - t0
    return row

  # -- checkpointing ----------------------------------------------------------------------
  def save_checkpoint(self) -> str:
    """Atomic checkpoint (experiments.run.rundir); returns the ckpt-* path."""
    t0 = time.perf_counter()
    self.adder.flush()
    reverb_path = rundir.checkpoint_reverb(self.logdir, self.client)
    run = self.run_config
    final = rundir.write_checkpoint(
        self.logdir, self.agent_steps, reverb_path=reverb_path,
        learner_state=self.learner.save(), config=self.config,
        spaces=self.spaces, run=run, mode=MODE,
        adder_state=self.adder.get_state(), schedule=self.schedule,
        latent_store=self.dataset.latent_store,
        run_state=rundir.make_run_state(
            mode=MODE, segment=self.segment,
            counts={'actor_steps': self.agent_steps, 'env_steps': self.env_steps,
                    'episodes': self.episodes, 'learner_steps': self.updates},
            counter=self.counter.save(),
            learner={
                **self.updates_runner.get_state(),
                **rundir.sampler_state(self.dataset), 'wall_time': self.wall_time, 'next_log': self.next_log},
            actors=[{'offset': 0, 'num_envs': run.num_envs,
                     'num_items': self.adder.num_items,
                     'num_online_items': self.adder.num_online_items,
                     **self.actor.get_state()}],
            evaluator=self.evaluator.get_state(),
            recent_scores=self.recent_scores))
    self._t_ckpt += time.perf_counter() - t0
    self._log(f'[ckpt] {final} ({time.perf_counter() - t0:.1f}s)')
    return final

  # -- close ------------------------------------------------------------------------------------
  def close(self) -> None:
    """Closes whatever was built (also after a failed build)."""
    if self._closed:
      return
    self._closed = True
    for name, method in (('dataset', 'close'), ('logger', 'close'),
                         ('adder', 'close'), ('env', 'close'),
                         ('evaluator', 'close'), ('server', 'stop')):
      obj = getattr(self, name, None)
      if obj is None:
        continue
      try:
        getattr(obj, method)()
      except Exception:  # noqa: BLE001  (e.g. the server is already down)
        pass
