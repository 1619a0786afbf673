"""The single-process, resumable DreamerV3 run (Algorithm K, spec 6.1-6.5, 7.1-7.5).

``Trainer(experiment).run()`` wires one process from Acme parts, in the
shape of acme's ``LocalLayout`` (the experiment's builder makes every piece,
``experiments.run.experiment``):

  env      = VectorEnv(task, N)          # N envs as one dm_env.Environment
  server   = Reverb server with builder.make_replay_tables() (uniform +
             online), the uniform table's limiter adapted to one process
             (``reverb_tables.tables.for_one_process``)
  schedule = TrainSchedule(config)                      # spec 6.1, 6.2
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
SIGINT/SIGTERM). The pieces live in ``local_parts.LocalParts`` (built,
restored, saved and closed there), the rows, scores and progress lines in
``local_rows.LocalRows``. Run management (run directory, checkpoints, metric
rows, evaluation) is ``experiments.run``, shared with the Launchpad layout.

Resume: a start whose logdir holds a complete checkpoint continues from it
(learner TrainingState, latent store, Reverb tables and limiter, adder
counters, train schedule, counters, policy rng, eval schedule). Envs restart
their episodes (open episodes at the checkpoint are dropped; env seeds move to
a new segment so episodes are not replayed).
"""

from __future__ import annotations

import time
from typing import Any, Dict

import agent  # noqa: F401  (jax compat before acme)
from experiments.envs.observations import ObservationError
from experiments.layouts import stopping
from experiments.layouts.local_parts import MODE, LocalParts
from experiments.layouts.local_rows import LocalRows
from experiments.run import metrics, rundir
from experiments.run.config import enable_compilation_cache, log, next_multiple
from experiments.run.experiment import DreamerExperiment


class Trainer:
  """One single-process DreamerV3 run (see module doc).

  ``Trainer(experiment)`` only validates (--logdir, resume compatibility)
  and touches nothing; ``run()`` builds, trains to ``run.env_steps``,
  evaluates, checkpoints and reports; ``close()`` releases the server and
  envs. ``parts``: the pieces (``LocalParts``); ``rows``: the rows
  (``LocalRows``).
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
    self.parts = LocalParts(experiment)
    self.rows = None

  def _log(self, msg: str) -> None:
    if self.run_config.verbose:
      log(msg)

  # -- construction --------------------------------------------------------------
  def _build(self) -> None:
    run = self.run_config
    if run.jax_cache_dir:
      enable_compilation_cache(run.jax_cache_dir)
    state = rundir.load_resume_state(run, self._resume_from)
    self.segment = state['segment'] + 1 if state else 0
    # The hooks are this run's methods: they reach the rows, made below,
    # only once the loop runs.
    self.parts.build(self.segment, bool(state), logger=lambda: self.rows.logger,
                     on_skip_stop=self._write_row,
                     on_episode=self._record_episode, should_stop=self._tick)
    self.wall_time = 0.0
    self.rows = LocalRows(self.parts, segment=self.segment,
                          recent_scores=state['recent_scores'] if state else [])
    if state:
      size = self.parts.restore(state, self._resume_from)
      self.wall_time = state['learner']['wall_time']
      self._log(f'[run] resumed from {self._resume_from} (segment '
                f'{self.segment}): {metrics.fmt_steps(self.env_steps)} env '
                f'steps, {self.updates} updates, {size} replay items')
    # Log / eval grids follow the current flags (they may change on resume).
    self.next_log = next_multiple(self.env_steps, run.log_every)
    self.next_eval = (next_multiple(self.env_steps, run.eval_every)
                      if run.eval_every else None)
    rundir.start_segment(run, state)   # validated: now the logdir may change
    self.rows.open()
    self._built = True

  # -- counts (LocalParts') ---------------------------------------------------------
  @property
  def agent_steps(self) -> int:
    return self.parts.agent_steps

  @property
  def env_steps(self) -> int:
    return self.parts.env_steps

  @property
  def updates(self) -> int:
    return self.parts.updates

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
    self.rows.start()
    self._log(f'[run] {run.task} size={self.config.size} envs={run.num_envs} '
              f'repeat={run.action_repeat} train_ratio={self.config.train_ratio:g} '
              f'B={self.config.batch_size} T={self.config.batch_length} '
              f'target={metrics.fmt_steps(run.env_steps)} env steps, '
              f'logdir={self.logdir}')
    worked = not self.done
    if worked:
      try:
        self.parts.loop.run()
      except ObservationError:   # refused before the adder saw it: keep
        self._update_wall()      # what was stored, to resume from
        self._log('[run] a bad observation ends the run; what was stored '
                  f'before it is in {self.save_checkpoint()}')
        raise
    stopped = self._signals.requested
    if worked or stopped:
      if not stopped:
        if self._final_eval_due():
          self.evaluate()
        if self.rows.last_row_step != self.env_steps:
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
        'updates': self.updates, 'episodes': self.parts.episodes,
        'recent_scores': list(self.rows.recent_scores), 'stopped': stopped,
        'wall_time': self.wall_time,
        'update_cache_size': self.parts.learner.update_cache_size(),
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
    last = self.parts.evaluator.last_eval_step
    if last is None or not run.eval_every:
      return last != self.env_steps
    return self.env_steps - last >= run.eval_every / 2

  # -- rows (LocalRows') -----------------------------------------------------------
  def _record_episode(self, ep) -> None:
    self.rows.record_episode(ep)

  def _write_row(self) -> None:
    self.rows.write(self.wall_time)

  def _progress(self, final: bool) -> None:
    line = self.rows.progress(self.wall_time, final)
    self._log(line)

  # -- evaluation (spec 7.3) ------------------------------------------------------------
  def evaluate(self) -> Dict[str, Any]:
    """One episode in each of ``eval_episodes`` separate envs (spec 7.3)."""
    if not self.run_config.eval_episodes:
      return {}
    t0 = time.perf_counter()
    row = self.parts.evaluator.evaluate(self.env_steps, updates=self.updates)
    self.rows.eval_s += time.perf_counter() - t0
    return row

  # -- checkpointing ----------------------------------------------------------------------
  def save_checkpoint(self) -> str:
    """Atomic checkpoint (``LocalParts.save``); returns the ckpt-* path."""
    t0 = time.perf_counter()
    final = self.parts.save(segment=self.segment, wall_time=self.wall_time,
                            next_log=self.next_log,
                            recent_scores=self.rows.recent_scores)
    self.rows.checkpoint_s += time.perf_counter() - t0
    self._log(f'[ckpt] {final} ({time.perf_counter() - t0:.1f}s)')
    return final

  # -- close ------------------------------------------------------------------------------------
  def close(self) -> None:
    """Closes whatever was built (also after a failed build)."""
    if self._closed:
      return
    self._closed = True
    self.parts.close(logger=self.rows.logger if self.rows else None)
