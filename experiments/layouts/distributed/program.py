r"""DreamerV3 as a Launchpad program (``local_mp``), in Acme's distributed layout.

``build_program(spec)`` follows ``acme.jax.layouts.distributed_layout``:

  replay     ``lp.ReverbNode`` with the builder's tables ('ratio': the uniform
             table's SampleToInsertRatio couples actors and learner, spec 6.1
             "parallel"); Reverb checkpoints in ``<logdir>/checkpoints/reverb``.
  counter    ``lp.CourierNode`` over an ``acme.utils.counting.Counter``
             (actor_steps, env_steps, episodes, learner_steps).
  learner    ``lp.CourierNode``: the builder's ``DreamerLearner`` over the
             builder's dataset (one batch ahead, spec 6.3b), the variable
             source of the actors; writes metrics rows and checkpoints.
             With ``--learner_processes`` P > 1, P - 1 more nodes in this
             group (``learner_peer.py``) run each update with it over
             ``jax.distributed``, each sampling B / P rows.
  actor      ``num_actors`` x ``lp.CourierNode`` running an
             ``acme.EnvironmentLoop`` (``experiments.run.env_loop``) with the
             builder's actor over ``num_envs / num_actors`` envs.
  evaluator  (with ``--eval_episodes`` > 0) spec 7.3 evaluations every
             ``--eval_every`` env steps and at the end.
  limiter    the step budget (``acme.utils.lp_utils.StepsLimiter``'s job).
  join       (with ``--join_slots`` > 0) the join service
             (``join/service.py``): the one way in for remote actors on
             other hosts, authenticated by the run secret; it stores their
             steps through the builder's adder on this host.

What Acme's layout lacks is added here as small named pieces: the learner
also owns the latent write-back store (spec 5.9); checkpoints pair the Reverb
checkpoint with every actor's adder counters (step ids); a step budget that
ends with a final checkpoint and evaluation rather than a bare ``lp.stop()``;
resume (``experiments.run.rundir``, the same run directory as one process).

Files: spec.py (what every node is given), node_utils.py, learner.py,
learner_peer.py, actor.py and evaluator.py (the worker nodes), this file (replay, counter and
limiter nodes, the program), launch.py (validate, launch, restart, report),
supervisor.py (restarts of dead nodes, issue 22), lp_init.py (per-process
set-up), join/ (remote actors that join a running program: the service,
the remote actor, their wire format and book of claims), secret.py (the run
secret), addresses.py (the address other hosts reach, ``--bind``).

Worker ids: all actors write into one global layout of ``num_envs`` env
workers; actor k's adder has ``worker_offset = k * n`` (n envs per actor), so
step ids (worker, index) stay unique across actors and the learner's single
``LatentStore`` keeps one ring per global worker.

Stopping: the step budget ends in ``StepLimiter`` -> ``actor.pause()`` (all)
-> ``learner.finish()`` (final checkpoint) -> ``evaluator.evaluate_final()``
-> ``lp.stop()``. A Ctrl-C or SIGTERM of the launcher makes Launchpad send
SIGTERM to every node; the learner then writes a final checkpoint while the
replay server, counter, actors and evaluator wait for it (a marker file, at
most ``stop_grace_s``), and Launchpad's termination notice (``stop_grace_s``
+ 30 s) kills whatever is left. Every node process also gets SIGTERM if the
launcher dies (``lp_init.py``).

Checkpoints (``experiments.run.rundir``): the learner checkpoints the Reverb
server first and then reads every actor's adder counters, so the saved
step-id counters are never behind an item in the Reverb checkpoint
(``run_state.json`` has ``"mode": "distributed"``). See docs/deviations.md
"Distributed runs".
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Dict, Optional, Sequence

import agent  # noqa: F401  (jax compat before anything imports acme)
from acme.utils import counting
from experiments.layouts.distributed import lp_init
from experiments.layouts.distributed.actor import ActorNode
from experiments.layouts.distributed.evaluator import EvaluatorNode
from experiments.layouts.distributed.join.service import JoinService
from experiments.layouts.distributed.learner import LearnerNode
from experiments.layouts.distributed.learner_peer import LearnerPeerNode
from experiments.layouts.distributed.node_utils import (
    call_until, lp_hooks, run_guarded)
from experiments.layouts.distributed.spec import (
    NODE_GROUP_ENV, SUMMARY_FILE, ProgramSpec)
from experiments.run import rundir
from experiments.run.config import log

# --- replay and counter nodes -------------------------------------------------------


def replay_node_tables(spec: ProgramSpec):
  """The builder's tables with the 'ratio' rate limiter (spec 6.1 parallel).

  Runs in the replay process; it also registers a Launchpad stop handler that
  keeps the server up after a stop signal until the learner has written its
  final checkpoint (at most ``stop_grace_s``)."""
  tables = spec.builder().make_replay_tables()
  try:
    import launchpad as lp
    lp.register_stop_handler(lambda *_: spec.wait_for_learner())
  except Exception:  # noqa: BLE001  (outside a Launchpad process)
    pass
  return tables


def make_reverb_checkpointer(path: str):
  """``DefaultCheckpointer`` on ``path``: loads the latest checkpoint there."""
  import reverb
  os.makedirs(path, exist_ok=True)
  return reverb.checkpointers.DefaultCheckpointer(path=path)


class CounterNode(counting.Counter):
  """The root Counter (restored on resume); ``run()`` serves until the program
  stops and then until the learner's final checkpoint (which reads it)."""

  def __init__(self, spec: ProgramSpec, state: Optional[Dict[str, Any]] = None):
    super().__init__()
    self._spec = spec
    if state:
      self.restore(state)

  def run(self) -> None:
    lp_hooks()[0].wait()
    self._spec.wait_for_learner()


# --- step limiter -----------------------------------------------------------------------


class StepLimiter:
  """Stops the program at ``--env_steps``: ``acme.utils.lp_utils.StepsLimiter``
  polls the counter and calls ``lp.stop()``; this one first pauses the actors
  (their last items flushed), asks the learner for its final checkpoint, the
  evaluator for the final evaluation, and writes ``summary.json``."""

  def __init__(self, spec: ProgramSpec, counter, learner, actors=(),
               evaluator=None):
    self._spec, self._counter, self._learner = spec, counter, learner
    self._actors, self._evaluator = list(actors), evaluator
    self._stop_event, self._stopper = lp_hooks()

  def run(self) -> None:
    run_guarded(self._spec, 'limiter', self._run)

  def _run(self) -> None:
    spec, stop = self._spec, self._stop_event
    budget = spec.run.env_steps
    last_print = 0.0
    while not stop.wait(spec.dist.poll_s):
      counts = call_until(self._counter.get_counts, stop.is_set)
      env_steps = int(counts.get('env_steps', 0))
      if time.monotonic() - last_print >= spec.run.progress_every:
        log(f'[limiter] {env_steps}/{budget} env steps, '
                   f'{int(counts.get("learner_steps", 0))} learner steps')
        last_print = time.monotonic()
      if env_steps >= budget:
        break
    else:
      return
    log(f'[limiter] step budget {budget} reached: pausing the actors')
    futures = [actor.futures.pause() for actor in self._actors]
    paused = [call_until(f.result, stop.is_set) for f in futures]
    log(f'[limiter] actors paused ({sum(map(bool, paused))}/'
               f'{len(paused)}); final checkpoint')
    summary = call_until(self._learner.finish, stop.is_set)
    if self._evaluator is not None:
      summary['eval'] = call_until(
          functools.partial(self._evaluator.evaluate_final,
                            summary['env_steps']), stop.is_set)
    summary['stopped_by'] = 'step_limiter'
    rundir.atomic_write(os.path.join(spec.launch_dir, SUMMARY_FILE),
                        json.dumps(summary, default=rundir.jsonable))
    log('[limiter] stopping the program')
    self._stopper()


# --- the program ----------------------------------------------------------------------------


def build_program(spec: ProgramSpec, name: str = 'dreamerv3'):
  """The ``lp.Program`` of the module doc (groups in ``GROUPS``)."""
  import launchpad as lp

  dist = spec.dist
  program = lp.Program(name=name)
  with program.group('replay'):
    replay = program.add_node(lp.ReverbNode(
        functools.partial(replay_node_tables, spec),
        checkpoint_ctor=functools.partial(make_reverb_checkpointer,
                                          rundir.reverb_dir(spec.run.logdir))))
  with program.group('counter'):
    counter = program.add_node(lp.CourierNode(
        CounterNode, spec, (spec.run_state or {}).get('counter')))

  def timed(handle, timeout=dist.rpc_timeout_s):
    handle.set_client_kwargs(call_timeout=timeout)
    return handle

  learner_node = lp.CourierNode(LearnerNode)
  learner = timed(learner_node.create_handle())   # actors, evaluator, join
  learner_untimed = learner_node.create_handle()    # finish(): no timeout
  timed(counter)
  actor_nodes = [lp.CourierNode(ActorNode, spec, k, replay, learner, counter)
                 for k in range(dist.num_actors)]
  actors = [timed(node.create_handle(), 30.0) for node in actor_nodes]
  actors_untimed = [node.create_handle() for node in actor_nodes]   # pause()
  evaluator_node = evaluator = evaluator_untimed = None
  if spec.run.eval_episodes:
    evaluator_node = lp.CourierNode(EvaluatorNode, spec, learner, counter)
    evaluator = timed(evaluator_node.create_handle(), 30.0)
    evaluator_untimed = evaluator_node.create_handle()
  join_node = join = None
  if dist.join_slots:          # remote actors come in through the service
    join_node = lp.CourierNode(JoinService, spec, replay, learner, counter)
    join = timed(join_node.create_handle())
  learner_node.configure(spec, replay, counter, actors, evaluator, join)
  with program.group('learner'):
    program.add_node(learner_node)
    local = dist.learner_processes - dist.remote_learner_processes
    for k in range(1, local):      # multi-process learner, on this machine
      program.add_node(lp.CourierNode(LearnerPeerNode, spec, k, replay))
  with program.group('actor'):
    for node in actor_nodes:
      program.add_node(node)
  if evaluator_node is not None:
    with program.group('evaluator'):
      program.add_node(evaluator_node)
  if join_node is not None:
    with program.group('join'):
      program.add_node(join_node)
  with program.group('limiter'):
    program.add_node(lp.CourierNode(StepLimiter, spec, counter,
                                    learner_untimed, actors_untimed,
                                    evaluator_untimed))
  return program


def local_resources(spec: ProgramSpec, init_file: str, groups: Sequence[str]):
  """``{group: lp.PythonProcess}``: init file, env vars, notice period.

  Only the learner may use an accelerator; every other node runs jax on CPU.
  """
  base = {'PYTHONUNBUFFERED': '1', 'MUJOCO_GL': 'disable',
          'TF_CPP_MIN_LOG_LEVEL': '1'}
  out = {}
  for group in groups:
    env = dict(base)
    if group != 'learner':
      env['JAX_PLATFORMS'] = 'cpu'
    env[lp_init.NOTICE_ENV] = str(spec.dist.termination_notice_s)
    env[NODE_GROUP_ENV] = group      # which node a process is (ps e, tests)
    if spec.run.jax_cache_dir:
      env[lp_init.JAX_CACHE_ENV] = spec.run.jax_cache_dir
    out[group] = lp_init.python_process(init_file, env=env)
  return out
