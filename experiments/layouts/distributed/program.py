r"""DreamerV3 as a Launchpad program (``local_mp``), in Acme's distributed layout.

``build_program(settings)`` follows acme's ``make_distributed_experiment``
(``acme.jax.layouts.distributed_layout`` in acme 0.4.0): the node
constructors below sit beside the wiring, build every piece from the
experiment's builder inside the node's process, and hand the pieces to the
node classes, which hold behaviour only:

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

Files: the package index (``__init__.py``).

Worker ids: all actors write into one global layout of ``num_envs`` env
workers; actor k's adder has ``worker_offset = k * n`` (n envs per actor), so
step ids (worker, index) stay unique across actors and the learner's single
``LatentStore`` keeps one ring per global worker.

Stopping: ``experiments.layouts.stopping`` (who decides, who is told, in
what order). Every node process also gets SIGTERM if the launcher dies
(``lp_init.py``).

Checkpoints: ``checkpoints.py`` (the learner coordinates them; the run
directory is the one-process run's, ``experiments.run.rundir``). See
docs/deviations.md "Distributed runs".
"""

from __future__ import annotations

import functools
import os
from typing import Optional, Sequence

import agent  # noqa: F401  (jax compat before anything imports acme)
from acme.utils import counting
from experiments.layouts import stopping
from experiments.layouts.distributed import lp_init
from experiments.layouts.distributed.actor import ActorNode
from experiments.layouts.distributed.checkpoints import CheckpointCoordinator
from experiments.layouts.distributed.evaluator import EvaluatorNode
from experiments.layouts.distributed.join.service import (
    CLAIMS_FILE, JoinService)
from experiments.layouts.distributed.join.slots import JoinSlots
from experiments.layouts.distributed.learner import LearnerNode
from experiments.layouts.distributed.learner_peer import LearnerPeerNode
from experiments.layouts.distributed.rows import (
    Progress, RunCounts, TrainRows, WaitHooks)
from experiments.layouts.distributed.rpc import (
    SyncedCounter, call_until, wait_for_replay)
from experiments.layouts.distributed.secret import ensure_secret, secret_path
from experiments.layouts.distributed.settings import ProgramSettings
from experiments.layouts.distributed.supervisor import node_restart
from experiments.layouts.distributed.variables import VariableSource
from experiments.run import metrics, rundir
from experiments.run.config import log, next_multiple, segment_seed

# The program's node groups.
GROUPS = ('replay', 'counter', 'limiter', 'learner', 'actor', 'evaluator',
          'join')
# Each node process's group ('replay', 'learner', 'actor', ...).
NODE_GROUP_ENV = 'DREAMER_NODE_GROUP'


# --- node constructors (each runs in its node's process) ---------------------------


def make_replay_tables(settings: ProgramSettings):
  """The builder's tables (the 'ratio' limiter: spec 6.1 parallel). The
  replay server stays up after a stop signal until the learner's final
  checkpoint (``stopping.serve_until_learner_done``)."""
  tables = settings.builder.make_replay_tables()
  try:
    import launchpad as lp
    lp.register_stop_handler(
        lambda *_: stopping.serve_until_learner_done(settings))
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

  def __init__(self, settings: ProgramSettings):
    super().__init__()
    self._settings = settings
    state = (settings.run_state or {}).get('counter')
    if state:
      self.restore(state)

  def run(self) -> None:
    stopping.serve_until_learner_done(self._settings,
                                      program=stopping.lp_hooks()[0])


def make_learner_node(settings: ProgramSettings, replay, counter, actors,
                      evaluator, join) -> LearnerNode:
  """Process 0 of the learner: the builder's learner over its dataset,
  restored on resume, and the node's jobs around it (``learner.py``)."""
  from agent import parallel
  from agent.builder import seed_keys
  from reverb_tables import tables as tables_lib

  # Before anything touches jax's devices: join the other learner processes.
  parallel.initialize_processes(settings.coordinator_address,
                                settings.dist.learner_processes, 0,
                                gloo_host=settings.gloo_host)
  run, builder = settings.run, settings.builder
  stop = stopping.NodeStop()
  info = wait_for_replay(replay, stop.requested)
  tables_lib.check_signatures(info, builder.make_replay_tables(),
                              rundir.reverb_dir(run.logdir))
  synced = SyncedCounter(counter, time_delta=settings.dist.counter_sync_s)
  run_counts = RunCounts(settings, synced)
  while_waiting = WaitHooks()           # the rows join once they exist
  dataset = builder.make_dataset_iterator(
      replay, should_stop=stop.requested, on_wait=while_waiting)
  learner = builder.make_learner(
      seed_keys(settings.config.seed)['learner'], builder.make_networks(),
      dataset, replay, synced,
      logger_fn=lambda: metrics.LearnerRows(run_counts.logger,
                                            lambda: run_counts.env_steps),
      log_every=run.learner_log_every, should_stop=stop.requested)
  progress = Progress(learner)
  if settings.resume:
    s = settings.run_state['learner']
    rundir.restore_learner(settings.resume, learner, dataset, s)
    progress.base_updates, progress.wall0 = int(s['updates']), float(
        s['wall_time'])
    log(f'[learner] resumed from {settings.resume}: {progress.updates} '
        f'updates, {len(dataset.latent_store)} stored latents')
  rows = TrainRows(
      settings=settings, run_counts=run_counts, progress=progress,
      learner=learner, dataset=dataset, replay=replay, actors=actors,
      join=join)
  while_waiting.add(rows.poll)    # rows stay on their grid while it waits
  checkpoints = CheckpointCoordinator(
      settings=settings, progress=progress, learner=learner, dataset=dataset,
      replay=replay, synced_counter=synced, counter=counter, actors=actors,
      evaluator=evaluator, join=join, rows=rows)
  return LearnerNode(
      settings=settings, stop=stop, learner=learner, dataset=dataset,
      progress=progress, rows=rows, checkpoints=checkpoints, join=join,
      variables=VariableSource(learner, lambda: progress.updates),
      health=rows.health)


def make_learner_peer_node(settings: ProgramSettings, process_id: int, replay,
                           gloo_host: Optional[str] = None) -> LearnerPeerNode:
  """Learner process ``process_id`` >= 1 (``learner_peer.py``), here or on
  another host (``remote_peers.py``)."""
  from agent import parallel
  from agent.builder import seed_keys

  dist = settings.dist
  parallel.initialize_processes(
      settings.coordinator_address, dist.learner_processes, process_id,
      gloo_host=settings.gloo_host if gloo_host is None else gloo_host)
  builder, stop = settings.builder, stopping.NodeStop()
  wait_for_replay(replay, stop.requested)
  dataset = builder.make_dataset_iterator(replay, should_stop=stop.requested)
  learner = builder.make_learner(
      seed_keys(settings.config.seed)['learner'], builder.make_networks(),
      dataset, should_stop=stop.requested)
  stop.also(learner.peers_stopped)     # process 0 stopped the learner
  if settings.resume:
    rundir.restore_learner(settings.resume, learner, dataset)
  return LearnerPeerNode(settings=settings, process_id=process_id,
                         learner=learner, dataset=dataset, stop=stop)


def make_actor_node(settings: ProgramSettings, actor_id: int, replay,
                    learner, counter) -> ActorNode:
  """Actor ``actor_id`` over env workers [k n, (k + 1) n): its envs, its
  adder (step ids continuing a resume, moved past the dead process's after
  an in-place restart) and the builder's actor."""
  import jax

  from agent.builder import seed_keys

  run, c, builder = settings.run, settings.config, settings.builder
  n = settings.envs_per_actor
  offset, name = actor_id * n, f'actor/{actor_id}'
  # k > 0: restarted in place by the supervisor after the node died: new env
  # seeds, a new policy stream and step ids past any the dead one used.
  restart = node_restart()
  env = run.make_env(n, segment_seed(c.seed, settings.segment,
                                     restart=restart), offset)
  wait_for_replay(replay, stopping.lp_hooks()[0].is_set)
  adder = builder.make_adder(replay, num_workers=n, worker_offset=offset)
  if settings.resume:      # step ids continue; item counts per actor
    saved = rundir.read_json(os.path.join(
        settings.resume, rundir.REPLAY_STATE_FILE))['adder']
    mine = next(a for a in settings.run_state['actors']
                if a['offset'] == offset)
    adder.set_state({'lengths': saved['lengths'][offset:offset + n],
                     'num_items': mine['num_items'],
                     'num_online_items': mine['num_online_items']})
  if restart:
    state = adder.get_state()
    jump = restart * settings.restart_index_jump
    adder.set_state({**state, 'lengths': [x + jump for x in state['lengths']]})
    log(f'[{name}] restart {restart} in place: env seeds of restart '
        f'{restart}, step ids from +{jump}')
  # Policy stream of (seed, actor, segment, restart): resumed segments and
  # restarted nodes never repeat it (a remote actor's: join/remote.py).
  key = jax.random.fold_in(jax.random.fold_in(
      seed_keys(c.seed)['actor'], actor_id), settings.segment)
  if restart:
    key = jax.random.fold_in(key, restart)
  actor = builder.make_actor(
      key, builder.make_policy(builder.make_networks()), adder, learner,
      num_envs=n, update_period=settings.dist.update_period, versioned=True)
  return ActorNode(
      settings=settings, actor_id=actor_id, offset=offset, env=env,
      adder=adder, actor=actor,
      counter=SyncedCounter(counter, time_delta=settings.dist.counter_sync_s),
      learner=learner)


def make_evaluator_node(settings: ProgramSettings, learner,
                        counter) -> EvaluatorNode:
  """Spec 7.3 evaluation (``experiments.run.evaluator.Evaluator``) with the
  resumed state; after an in-place restart, new eval env seeds and policy
  stream, and the next evaluation at the grid point after the counter's env
  steps now (the dead process may have done the ones since the
  checkpoint)."""
  import jax

  from agent.builder import seed_keys
  from experiments.run.evaluator import Evaluator

  run = settings.run
  restart = node_restart()
  key = jax.random.fold_in(seed_keys(settings.config.seed)['eval'],
                           settings.segment)
  if restart:
    key = jax.random.fold_in(key, restart)
  logger = metrics.OpenOnUse(run.logdir)      # eval rows
  evaluator = Evaluator(run, settings.builder, settings.segment, learner, key,
                        logger, restart=restart)
  evaluator.set_state((settings.run_state or {}).get('evaluator') or {})
  env_steps = int(settings.counts.get('env_steps', 0))
  if restart:
    env_steps = int(call_until(counter.get_counts, stopping.lp_hooks()[0]
                               .is_set).get('env_steps', env_steps))
  return EvaluatorNode(
      settings=settings, evaluator=evaluator, counter=counter,
      next_eval=(next_multiple(env_steps, run.eval_every) if run.eval_every
                 else None),
      logger=logger)


def make_join_node(settings: ProgramSettings, replay, learner,
                   counter) -> JoinService:
  """The join service (``join/service.py``): its book of claims, restored
  from the checkpoint and, after an in-place restart, from this launch's
  claims file (claim numbers, hence step ids, never repeat)."""
  from reverb_tables.packing import StepLayout

  run, dist, builder = settings.run, settings.dist, settings.builder
  secret = ensure_secret(secret_path(run.logdir, dist.join_secret_file))
  wait_for_replay(replay, stopping.lp_hooks()[0].is_set)
  book = JoinSlots(run.num_envs, dist.join_slots, settings.restart_index_jump,
                   dist.join_lease_s, dist.join_max_envs or None)
  book.restore((settings.run_state or {}).get('learner', {}).get('join'))
  claims_file = os.path.join(settings.launch_dir, CLAIMS_FILE)
  if node_restart() and os.path.exists(claims_file):
    book.restore(rundir.read_json(claims_file))
  return JoinService(
      settings=settings, book=book,
      make_adder=functools.partial(builder.make_adder, replay),
      layout=StepLayout.from_step_spec(builder.step_spec),
      counter=SyncedCounter(counter, time_delta=dist.counter_sync_s),
      learner=learner, secret=secret, claims_file=claims_file)


# --- the program ----------------------------------------------------------------------------


def build_program(settings: ProgramSettings, name: str = 'dreamerv3'):
  """The ``lp.Program`` of the module doc (groups in ``GROUPS``)."""
  import launchpad as lp

  dist, run = settings.dist, settings.run
  program = lp.Program(name=name)
  with program.group('replay'):
    replay = program.add_node(lp.ReverbNode(
        functools.partial(make_replay_tables, settings),
        checkpoint_ctor=functools.partial(make_reverb_checkpointer,
                                          rundir.reverb_dir(run.logdir))))
  with program.group('counter'):
    counter = program.add_node(lp.CourierNode(CounterNode, settings))

  def timed(handle, timeout=dist.rpc_timeout_s):
    handle.set_client_kwargs(call_timeout=timeout)
    return handle

  learner_node = lp.CourierNode(make_learner_node)
  learner = timed(learner_node.create_handle())   # actors, evaluator, join
  learner_untimed = learner_node.create_handle()    # finish(): no timeout
  timed(counter)
  actor_nodes = [lp.CourierNode(make_actor_node, settings, k, replay, learner,
                                counter) for k in range(dist.num_actors)]
  actors = [timed(node.create_handle(), 30.0) for node in actor_nodes]
  actors_untimed = [node.create_handle() for node in actor_nodes]   # pause()
  evaluator_node = evaluator = evaluator_untimed = None
  if run.eval_episodes:
    evaluator_node = lp.CourierNode(make_evaluator_node, settings, learner,
                                    counter)
    evaluator = timed(evaluator_node.create_handle(), 30.0)
    evaluator_untimed = evaluator_node.create_handle()
  join_node = join = None
  if dist.join_slots:          # remote actors come in through the service
    join_node = lp.CourierNode(make_join_node, settings, replay, learner,
                               counter)
    join = timed(join_node.create_handle())
  # The learner's arguments include the actors' handles, and the actors
  # take the learner's: Launchpad's configure() closes that cycle.
  learner_node.configure(settings=settings, replay=replay, counter=counter,
                         actors=actors, evaluator=evaluator, join=join)
  with program.group('learner'):
    program.add_node(learner_node)
    local = dist.learner_processes - dist.remote_learner_processes
    for k in range(1, local):      # multi-process learner, on this machine
      program.add_node(lp.CourierNode(make_learner_peer_node, settings, k,
                                      replay))
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
    program.add_node(lp.CourierNode(stopping.StepLimiter, settings, counter,
                                    learner_untimed, actors_untimed,
                                    evaluator_untimed))
  return program


def local_resources(settings: ProgramSettings, init_file: str,
                    groups: Sequence[str]):
  """``{group: lp.PythonProcess}``: init file, env vars, notice period.

  Only the learner may use an accelerator; every other node runs jax on CPU.
  """
  base = {'PYTHONUNBUFFERED': '1',
          'MUJOCO_GL': 'egl' if settings.run.image else 'disable',
          'TF_CPP_MIN_LOG_LEVEL': '1'}
  out = {}
  for group in groups:
    env = dict(base)
    if group != 'learner':
      env['JAX_PLATFORMS'] = 'cpu'
    env[lp_init.NOTICE_ENV] = str(settings.dist.termination_notice_s)
    env[NODE_GROUP_ENV] = group      # which node a process is (ps e, tests)
    if settings.run.jax_cache_dir:
      env[lp_init.JAX_CACHE_ENV] = settings.run.jax_cache_dir
    out[group] = lp_init.python_process(init_file, env=env)
  return out
