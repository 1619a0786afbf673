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
  actor      ``num_actors`` x ``lp.CourierNode`` running an
             ``acme.EnvironmentLoop`` (``experiments.env_loop``) with the
             builder's actor over ``num_envs / num_actors`` envs.
  evaluator  (with ``--eval_episodes`` > 0) spec 7.3 evaluations every
             ``--eval_every`` env steps and at the end.
  limiter    the step budget (``acme.utils.lp_utils.StepsLimiter``'s job).

What Acme's layout lacks is added here as small named pieces: the learner
also owns the latent write-back store (spec 5.9); checkpoints pair the Reverb
checkpoint with every actor's adder counters (step ids); a step budget that
ends with a final checkpoint and evaluation rather than a bare ``lp.stop()``;
resume (``experiments.rundir``, the same run directory as one process).

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
launcher dies (``experiments/lp_init.py``).

Checkpoints (``experiments.rundir``): the learner checkpoints the Reverb
server first and then reads every actor's adder counters, so the saved
step-id counters are never behind an item in the Reverb checkpoint
(``run_state.json`` has ``"mode": "distributed"``). See docs/deviations.md
"Distributed runs".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
import time
import traceback
from typing import Any, Callable, Dict, Optional, Sequence

import agent  # noqa: F401  (jax compat before anything imports acme)
from acme.utils import counting
from agent.config import DreamerConfig
from agent.learner import StopRequested
from agent.types import EnvSpaces
from experiments import rundir

MODE = 'distributed'
GROUPS = ('replay', 'counter', 'limiter', 'learner', 'actor', 'evaluator')
LEARNER_DONE_FILE = 'learner_done'
SUMMARY_FILE = 'summary.json'
ERRORS_DIR = 'errors'
TERMINALS = ('output_to_files', 'current_terminal')
# Each actor's adder counters are saved + this margin: an item whose last step
# reached the Reverb checkpoint a moment before the actor bumped its counter
# can never share a step id with a step written after the resume.
STEP_ID_MARGIN = 1


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """Settings of the Launchpad program (the RunConfig holds the run's).

  num_actors: actor nodes; ``RunConfig.num_envs`` (total envs) must divide.
  update_period: the actors' ``VariableClient`` update_period (vector steps
    between asynchronous parameter fetches).
  lag_probe_every: vector steps between the actors' parameter-lag probes.
  counter_sync_s: time_delta of the actors' and learner's child Counters.
  poll_s: poll interval of the limiter, evaluator and learner bookkeeping.
  stop_grace_s: after a stop signal, the longest the replay server, actors
    and evaluator wait for the learner's final checkpoint.
  rpc_timeout_s: courier call timeout of the actors' and learner's RPCs.
  terminal: Launchpad local_mp terminal ('output_to_files' writes each
    node's output to ``<logdir>/lp_logs/segment-<n>/<group>/<i>``).
  """
  num_actors: int = 2
  update_period: int = 1
  lag_probe_every: int = 10
  counter_sync_s: float = 0.5
  poll_s: float = 0.5
  stop_grace_s: float = 60.0
  rpc_timeout_s: float = 60.0
  terminal: str = 'output_to_files'

  def __post_init__(self):
    if self.num_actors < 1:
      raise ValueError(f'--num_actors must be >= 1, got {self.num_actors}')
    if self.update_period < 1:
      raise ValueError(f'--actor_update_period must be >= 1, got '
                       f'{self.update_period}')
    if self.lag_probe_every < 1:
      raise ValueError('lag_probe_every must be >= 1')
    if self.stop_grace_s <= 0:
      raise ValueError(f'--stop_grace must be > 0 seconds, got {self.stop_grace_s}')
    if self.terminal not in TERMINALS:
      raise ValueError(f'--lp_terminal must be one of {TERMINALS}, got '
                       f'{self.terminal!r}')

  @property
  def termination_notice_s(self) -> int:
    """Launchpad's notice before it kills nodes that ignore a stop."""
    return int(self.stop_grace_s + 30)


@dataclasses.dataclass
class ProgramSpec:
  """Everything a node needs (pickled into every node process).

  run_state: the ``run_state.json`` of the checkpoint resumed from (or None);
  resume: that checkpoint's path; segment: resume count (env seeds move with
  it, as in the single-process run); launch_dir: a per-launch scratch folder
  (marker files, errors, summary).
  """
  run: rundir.RunConfig
  config: DreamerConfig
  dist: DistributedConfig
  spaces: EnvSpaces
  launch_dir: str
  segment: int = 0
  resume: Optional[str] = None
  run_state: Optional[Dict[str, Any]] = None

  def __post_init__(self):
    if self.run.num_envs % self.dist.num_actors:
      raise ValueError(
          f'--num_envs {self.run.num_envs} (total training envs) must be a '
          f'multiple of --num_actors {self.dist.num_actors}')

  @property
  def envs_per_actor(self) -> int:
    return self.run.num_envs // self.dist.num_actors

  @property
  def learner_done_path(self) -> str:
    return os.path.join(self.launch_dir, LEARNER_DONE_FILE)

  @property
  def counts(self) -> Dict[str, float]:
    return dict((self.run_state or {}).get('counts', {}))

  def builder(self, **kwargs):
    from agent.builder import DreamerBuilder
    run = self.run
    return DreamerBuilder(self.config, self.spaces, num_envs=run.num_envs,
                          rate_limiter='ratio', chunk_length=run.chunk_length,
                          eval_policy=run.eval_policy, prefetch=run.prefetch,
                          **kwargs)

  def wait_for_learner(self) -> bool:
    """Blocks until the learner's final checkpoint is written (or the grace)."""
    deadline = time.monotonic() + self.dist.stop_grace_s
    while not os.path.exists(self.learner_done_path):
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.1)
    return True


# --- small helpers ------------------------------------------------------------


def _lp_hooks():
  """(stop event, program stopper) of this node; inert outside Launchpad."""
  try:
    import launchpad as lp
    from launchpad import context
    return lp.stop_event(), context.get_context().program_stopper
  except (RuntimeError, AssertionError, AttributeError):
    event = threading.Event()
    return event, event.set


def _touch(path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'a'):
    pass


def record_error(spec: ProgramSpec, node: str) -> None:
  """Writes the current exception's traceback to <launch_dir>/errors/<node>."""
  text = traceback.format_exc()
  rundir.log(f'[{node}] failed:\n{text}')
  try:
    path = os.path.join(spec.launch_dir, ERRORS_DIR, node.replace('/', '_'))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)
  except OSError:
    pass


def _call_until(fn: Callable[[], Any], stop: Callable[[], bool],
                poll: float = 0.2):
  """Runs a (blocking RPC) ``fn`` in a thread; returns its result, or raises
  ``StopRequested`` once ``stop()`` is true first (signals stay deliverable)."""
  box: Dict[str, Any] = {}
  done = threading.Event()

  def target():
    try:
      box['value'] = fn()
    except BaseException as e:  # noqa: BLE001  (re-raised in the caller)
      box['error'] = e
    done.set()

  threading.Thread(target=target, daemon=True).start()
  while not done.wait(poll):
    if stop():
      raise StopRequested()
  if 'error' in box:
    raise box['error']
  return box['value']


def wait_for_replay(client, stop: Callable[[], bool], poll: float = 0.5):
  """Blocks until the Reverb server answers (it may start after us)."""
  while True:
    try:
      return client.server_info(timeout=5)
    except Exception:  # noqa: BLE001  (server not up yet)
      if stop():
        raise StopRequested()
      time.sleep(poll)


class SyncedCounter(counting.Counter):
  """``acme.utils.counting.Counter`` child with ``flush()``: sends the local
  counts to the parent now (before a checkpoint or a pause), so the counts the
  limiter and the checkpoints read are exact at those points."""

  def flush(self) -> Dict[str, float]:
    self._last_sync_time = 0.0
    return self.get_counts()


class VersionedVariableClient:
  """Acme ``VariableClient`` over ('policy', 'num_updates'): ``params`` is what
  ``DreamerActor`` reads; ``version`` the learner's update count then."""

  def __init__(self, source, update_period: int = 1):
    from acme.jax import variable_utils
    self._client = variable_utils.VariableClient(
        source, ['policy', 'num_updates'], update_period=update_period)

  @property
  def params(self):
    return self._client.params[0]

  @property
  def version(self) -> int:
    return int(self._client.params[1])

  def update(self, wait: bool = False) -> None:
    self._client.update(wait)

  def update_and_wait(self) -> None:
    self._client.update_and_wait()


def make_environment(spec: ProgramSpec, num_envs: int, seed: int,
                     first_index: int = 0):
  """``VectorEnvironment`` whose env i is seeded ``seed * 1000 + first_index + i``."""
  return spec.run.make_env(num_envs, seed, first_index)


# --- replay and counter nodes -------------------------------------------------------


def make_replay_tables(spec: ProgramSpec):
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
    _lp_hooks()[0].wait()
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
    self._stop_event, self._stopper = _lp_hooks()

  def run(self) -> None:
    try:
      self._run()
    except StopRequested:
      pass
    except Exception:  # noqa: BLE001
      if not self._stop_event.is_set():
        record_error(self._spec, 'limiter')
        self._stopper()
        raise

  def _run(self) -> None:
    spec, stop = self._spec, self._stop_event
    budget = spec.run.env_steps
    last_print = 0.0
    while not stop.wait(spec.dist.poll_s):
      counts = _call_until(self._counter.get_counts, stop.is_set)
      env_steps = int(counts.get('env_steps', 0))
      if time.monotonic() - last_print >= spec.run.progress_every:
        rundir.log(f'[limiter] {env_steps}/{budget} env steps, '
                   f'{int(counts.get("learner_steps", 0))} learner steps')
        last_print = time.monotonic()
      if env_steps >= budget:
        break
    else:
      return
    rundir.log(f'[limiter] step budget {budget} reached: pausing the actors')
    futures = [actor.futures.pause() for actor in self._actors]
    paused = [_call_until(f.result, stop.is_set) for f in futures]
    rundir.log(f'[limiter] actors paused ({sum(map(bool, paused))}/'
               f'{len(paused)}); final checkpoint')
    summary = _call_until(self._learner.finish, stop.is_set)
    if self._evaluator is not None:
      summary['eval'] = _call_until(
          functools.partial(self._evaluator.evaluate_final,
                            summary['env_steps']), stop.is_set)
    summary['stopped_by'] = 'step_limiter'
    rundir.atomic_write(os.path.join(spec.launch_dir, SUMMARY_FILE),
                        json.dumps(summary, default=rundir.jsonable))
    rundir.log('[limiter] stopping the program')
    self._stopper()


# --- the program ----------------------------------------------------------------------------


def build_program(spec: ProgramSpec, name: str = 'dreamerv3'):
  """The ``lp.Program`` of the module doc (groups in ``GROUPS``)."""
  import launchpad as lp

  from experiments.lp_nodes import ActorNode, EvaluatorNode, LearnerNode
  dist = spec.dist
  program = lp.Program(name=name)
  with program.group('replay'):
    replay = program.add_node(lp.ReverbNode(
        functools.partial(make_replay_tables, spec),
        checkpoint_ctor=functools.partial(make_reverb_checkpointer,
                                          rundir.reverb_dir(spec.run.logdir))))
  with program.group('counter'):
    counter = program.add_node(lp.CourierNode(
        CounterNode, spec, (spec.run_state or {}).get('counter')))

  def timed(handle, timeout=dist.rpc_timeout_s):
    handle.set_client_kwargs(call_timeout=timeout)
    return handle

  learner_node = lp.CourierNode(LearnerNode)
  learner = timed(learner_node.create_handle())   # actors, evaluator
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
  learner_node.configure(spec, replay, counter, actors, evaluator)
  with program.group('learner'):
    program.add_node(learner_node)
  with program.group('actor'):
    for node in actor_nodes:
      program.add_node(node)
  if evaluator_node is not None:
    with program.group('evaluator'):
      program.add_node(evaluator_node)
  with program.group('limiter'):
    program.add_node(lp.CourierNode(StepLimiter, spec, counter,
                                    learner_untimed, actors_untimed,
                                    evaluator_untimed))
  return program


def local_resources(spec: ProgramSpec, init_file: str, groups: Sequence[str]):
  """``{group: lp.PythonProcess}``: init file, env vars, notice period.

  Only the learner may use an accelerator; every other node runs jax on CPU.
  """
  from experiments import lp_init
  base = {'PYTHONUNBUFFERED': '1', 'MUJOCO_GL': 'disable',
          'TF_CPP_MIN_LOG_LEVEL': '1'}
  out = {}
  for group in groups:
    env = dict(base)
    if group != 'learner':
      env['JAX_PLATFORMS'] = 'cpu'
    env[lp_init.NOTICE_ENV] = str(spec.dist.termination_notice_s)
    out[group] = lp_init.python_process(init_file, env=env)
  return out
