r"""Launching the Launchpad program (``local_mp``): validate, run, summarise.

  python experiments/run_dmc.py --flagfile=experiments/flags/dmc_proprio.flags \
      --task=walker_walk --distributed --num_actors=4 --logdir=runs/walker_walk_lp

Every run flag means the same as in one process, except that ``--num_envs``
is the total number of training envs, split evenly over ``--num_actors``
actor processes (so the paper's 16 envs stay 16 envs). ``prepare(experiment,
dist)`` validates the logdir and the checkpoint to resume (nothing is
written before) and returns this launch's ``ProgramSettings``; ``run`` builds
``program.build_program(settings)`` and runs it; each node's output goes to
``<logdir>/lp_logs/segment-<n>/<group>/<index>``
(``--lp_terminal=output_to_files``, the default) or to this terminal.

Sealed (``--isolation``, ``seal.py``): the program runs in a private
network namespace of its own; only the join port is bound in the host's.

Re-running with the same ``--logdir`` resumes from the last checkpoint.
Ctrl-C (or SIGTERM) stops every node; the learner writes a checkpoint first
(within ``--stop_grace`` seconds). A second Ctrl-C kills at once. The step
budget stops the program by itself (final checkpoint, final evaluation).

Dead nodes (``supervisor.py``): a dead actor or evaluator is
restarted in place; when any other node dies, this launcher stops the
program and starts it again from the last complete checkpoint (what
re-running the command would do), each at most ``--max_restarts`` times.
Every restart is one log line and one row of ``<logdir>/restarts.jsonl``
(the learner's ``run/restarts`` metric).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from experiments.layouts import stopping
from experiments.layouts.distributed import lp_init, remote_peers, seal
from experiments.layouts.distributed.addresses import (
    LOOPBACK, format_address, listen_host, parse_address)
from experiments.layouts.distributed.join.service import (
    join_address, make_listener)
from experiments.layouts.distributed.program import build_program, local_resources
from experiments.layouts.distributed.secret import ensure_secret, secret_path
from experiments.layouts.distributed.settings import (
    MODE, DistributedConfig, ProgramSettings, check_layout)
from experiments.layouts.distributed.supervisor import RESTARTABLE_GROUPS
from experiments.run import health, metrics, rundir
from experiments.run import restarts as restart_log
from experiments.run.config import log
from experiments.run.experiment import DreamerExperiment


def _last_train_row(path: str) -> Optional[Dict[str, Any]]:
  for line in reversed(rundir.tail_lines(path)):
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if row.get('kind') == 'train':
      return row
  return None


def launcher_progress_line(row: Optional[Dict[str, Any]], target: int,
                           wall: float, eta: Optional[metrics.Eta] = None) -> str:
  """The launcher's progress line, from the newest train row; ``eta`` (marked
  here with the row) gives the time left at the recent rate."""
  if not row:
    return f'[run] 0/{target} env steps (starting: replay fill / compilation)'

  def fmt(key, spec='.1f'):
    x = row.get(key)
    return '-' if x is None else format(x, spec)

  extra = (f' | replay ratio {fmt("replay/ratio_window")} (target '
           f'{row.get("replay/ratio_target", 0):g}) | learner idle '
           f'{fmt("learner/idle_frac", ".0%")} | param lag '
           f'{fmt("actor/param_lag_updates_mean")} updates')
  score = row.get('episode/recent_score_mean')
  left = None
  if eta is not None:
    eta.mark(row.get('wall_time', wall), row['env_step'],
             training=row['updates'] > 0)
    left = eta.seconds_left(row['env_step'], target)
  return metrics.progress_line(row['env_step'], target, row['updates'],
                              row.get('fps/env_steps_per_s') or 0.0, wall,
                              [] if score is None else [score], extra,
                              eta=left)


def prepare(experiment: DreamerExperiment, dist: DistributedConfig,
            decision: Optional[seal.Decision] = None):
  """Checks the program's layout, whether it can be sealed
  (``--isolation``; ``decision`` when a restart already knows), the logdir
  and the checkpoint to resume; returns this launch's ``ProgramSettings``,
  or a summary dict when the budget was already reached. ValueError (before
  anything is written) for bad settings, and for ``--isolation=required``
  where the program cannot be sealed."""
  run, config = experiment.run, experiment.config
  check_layout(run, dist)
  if decision is None:
    decision = seal.decide(dist)
  latest = rundir.validate(run, config, MODE)
  state = rundir.load_resume_state(run, latest)
  if state:
    saved = int((state['learner'].get('join') or {}).get('num_slots', 0))
    if saved != dist.join_slots:
      raise ValueError(
          f'--join_slots {dist.join_slots} differs from the checkpoint '
          f'{latest} ({saved}): its latent store has one ring per env worker; '
          f'resume with --join_slots={saved}')
  rundir.start_segment(run, state)
  if dist.join_slots or dist.remote_learner_processes:
    # The run secret (secret.py), before any node or other host needs it.
    ensure_secret(secret_path(run.logdir, dist.join_secret_file))
  if state and stopping.budget_reached(state['counts'].get('env_steps', 0),
                                       run.env_steps):
    return {'checkpoint': latest, 'env_steps': state['counts']['env_steps'],
            'updates': state['learner']['updates'], 'already_done': True,
            'logdir': run.logdir}
  segment = state['segment'] + 1 if state else 0
  coordinator = dist.coordinator_address
  if dist.learner_processes > 1 and not coordinator:
    import portpicker   # Launchpad's own port picker
    coordinator = format_address(LOOPBACK, portpicker.pick_unused_port())
  settings = ProgramSettings(
      experiment=experiment, dist=dist,
      launch_dir=tempfile.mkdtemp(prefix='dreamer-lp-'), segment=segment,
      resume=latest, run_state=state, coordinator_address=coordinator,
      sealed=decision.sealed, unsealed=decision.reason)
  if latest:
    log(f'[run] resuming from {latest} (segment {segment}, '
        f'{state["counts"].get("env_steps", 0)} env steps, '
        f'{state["learner"]["updates"]} updates)')
  return settings


def open_ports(settings: ProgramSettings, program) -> Dict[str, list]:
  """{group: ports} of the launched program's unauthenticated listeners
  (Reverb and courier bind every interface, the join node's courier port
  included; the coordination service its address; gloo a port of its own
  choosing). The join service's own port is not one: it authenticates."""
  out: Dict[str, list] = {}
  for group, nodes in program.groups.items():
    for node in nodes:
      address = getattr(node, 'reverb_address', None) or getattr(
          node, 'courier_address', None)
      if address is not None:
        out.setdefault(group, []).append(
            parse_address(address.resolve())[1])
  if settings.dist.learner_processes > 1:
    out['coordinator'] = [parse_address(settings.coordinator_address,
                                        '--coordinator_address')[1]]
    out['gloo'] = ['(chosen by gloo)']
  return out


# Node errors that a program restart cannot cure: the run stops at once.
FINAL_ERRORS = (health.PersistentSkipError.__name__,)


class NodeFailed(RuntimeError):
  """A node died and was not restarted in place; ``exit`` names it (None if
  only its Python error is known). The message holds its errors / log tail.
  ``final``: a restart would fail the same way (``FINAL_ERRORS``)."""

  def __init__(self, message: str, exit_=None, final: bool = False):
    super().__init__(message)
    self.exit, self.final = exit_, final


def run(prepared) -> Dict[str, Any]:
  """Runs what ``prepare`` returned (a summary when already done) to the
  step budget or a stop signal; returns a summary. When a node that is not
  restarted in place dies, starts the program again from the last complete
  checkpoint, up to ``--max_restarts`` times; RuntimeError past
  that, naming the node. A sealed program (``seal.py``) runs all of that in
  a child in its own network namespace; this process binds the join port
  in the host's network and waits."""
  if isinstance(prepared, dict) or not prepared.sealed or seal.inside():
    return _run_program(prepared)
  dist, broker = prepared.dist, None
  if dist.join_slots:
    try:
      listener = make_listener(dist.bind, dist.join_port)
    except OSError as e:
      raise RuntimeError(f'the join service cannot listen on '
                         f'{format_address(listen_host(dist.bind), dist.join_port)}: {e}'
                         ) from None
    broker = seal.ListenerBroker(listener, join_address(
        dist.bind, listener.getsockname()[1]))
    prepared = dataclasses.replace(prepared, join_listener=broker.path)
  log('[run] sealed: the program\'s nodes listen only in its own network '
      'namespace; exposed: ' + (f'the join service at {broker.address}'
                                if broker else 'nothing'))
  return seal.run_sealed(lambda: _run_program(prepared), broker)


def _run_program(prepared) -> Dict[str, Any]:
  """``run``'s launches and restarts, in this process."""
  restarts = 0
  while True:
    if isinstance(prepared, dict):
      log(f'[run] {prepared["logdir"]} already reached '
          f'{prepared["env_steps"]} env steps; nothing to train')
      return prepared
    settings = prepared
    run, dist = settings.run, settings.dist
    try:
      return _launch(settings)
    except NodeFailed as failure:
      in_place = (failure.exit is not None and
                  failure.exit.group in RESTARTABLE_GROUPS)
      if in_place or failure.final or restarts >= dist.max_restarts:
        # A final error names the cause even when a node of a restartable
        # group is blamed beside it.
        why = ('a restart cannot cure this error' if failure.final else
               'its in-place restarts are used up' if in_place else
               f'the program was restarted {restarts} times')
        raise RuntimeError(
            f'{failure}\n[run] stopped: {why} (--max_restarts '
            f'{dist.max_restarts}); rerun the same command to resume from '
            f'{rundir.latest_run_checkpoint(run.logdir) or "the start"}'
        ) from None
      restarts += 1
      ckpt = rundir.latest_run_checkpoint(run.logdir)
      record = {'kind': 'program', 'restart': restarts, 'checkpoint': ckpt,
                'node': None, 'returncode': None}
      if failure.exit is not None:
        record = failure.exit.record(**record)
      count = restart_log.append_restart(run.logdir, record)
      node = failure.exit.describe() if failure.exit else 'a node failed'
      log(f'[run] restart {restarts}/{dist.max_restarts} of the program '
          f'({node}); resuming from {ckpt or "the start"} '
          f'(run/restarts {count})')
    finally:
      shutil.rmtree(settings.launch_dir, ignore_errors=True)
    prepared = prepare(settings.experiment, dist, seal.Decision(
        settings.sealed, settings.unsealed))
    if not isinstance(prepared, dict):
      prepared = dataclasses.replace(prepared,
                                     join_listener=settings.join_listener)


def _node_log_dir(settings: ProgramSettings) -> str:
  """Sets Launchpad's termination notice and its node-log folder for this
  segment (a new one per attempt); returns the folder."""
  from absl import flags
  from launchpad.launch.run_locally import launch_local_output_to_files

  run, dist = settings.run, settings.dist
  # Launchpad reads the launcher's termination notice from its global flag
  # and the node-log folder from a module global it sets at import time (from
  # LAUNCHPAD_LOGGING_DIR), so a per-segment folder can only be set here.
  fv = flags.FLAGS
  if not fv.is_parsed():
    fv.mark_as_parsed()
  fv.lp_termination_notice_secs = dist.termination_notice_s
  log_dir = os.path.join(run.logdir, 'lp_logs', f'segment-{settings.segment}')
  attempt = 1
  while os.path.exists(log_dir):   # a program restart before a checkpoint
    attempt += 1
    log_dir = os.path.join(run.logdir, 'lp_logs',
                           f'segment-{settings.segment}-attempt-{attempt}')
  launch_local_output_to_files._LOGGING_DIR = log_dir  # noqa: SLF001
  return log_dir


def _manager_factory(settings: ProgramSettings, errors_dir: str,
                     manager_box: Dict[str, Any]):
  """The supervisor's worker-manager factory (``supervisor.installed``):
  in-place restarts are recorded and their error files set aside; a fatal
  learner exit writes the learner-done marker. The manager it makes goes
  into ``manager_box['m']``."""
  from experiments.layouts.distributed import supervisor

  run, dist = settings.run, settings.dist

  def on_restart(exit_, k):
    # A node restarted in place is not a failure of the run: set its error
    # record (if it wrote one) aside; its traceback stays in its log.
    if os.path.isdir(errors_dir):
      for name in os.listdir(errors_dir):
        if name.startswith(exit_.group):
          os.replace(os.path.join(errors_dir, name),
                     os.path.join(settings.launch_dir, f'restarted-{name}-{k}'))
    count = restart_log.append_restart(run.logdir, exit_.record(
        kind='in_place', restart=k, segment=settings.segment))
    log(f'[run] {exit_.describe()}: restart {k}/{dist.max_restarts} in place '
        f'(run/restarts {count})')

  def on_fatal(exit_):
    log(f'[run] {exit_.describe()}: stopping the program')
    if exit_.group == 'learner':   # nobody else waits for its checkpoint
      stopping.mark_learner_done(settings.launch_dir)

  def make_manager():
    manager_box['m'] = supervisor.RestartingWorkerManager(
        dist.max_restarts if dist.restarts_in_place else 0,
        on_restart, on_fatal)
    return manager_box['m']

  return make_manager


def _wait(manager, run, t0: float) -> Optional[BaseException]:
  """Waits for the program, logging the launcher's progress line every
  ``progress_every``; returns what the wait raised, if anything."""
  box: Dict[str, Any] = {}

  def wait():
    try:
      manager.wait()
    except BaseException as e:  # noqa: BLE001  (reported below)
      box['error'] = e

  waiter = threading.Thread(target=wait, name='lp-wait', daemon=True)
  waiter.start()
  metrics_path = os.path.join(run.logdir, rundir.METRICS_FILE)
  eta = metrics.Eta()
  while waiter.is_alive():
    waiter.join(run.progress_every)
    if waiter.is_alive() and run.verbose:
      log(launcher_progress_line(_last_train_row(metrics_path),
                                 run.env_steps, time.time() - t0, eta))
  return box.get('error')


def _kill_leftovers() -> List[str]:
  """Kills the launcher's child processes left after the stop; their
  'pid name'."""
  import psutil
  leftovers = []
  for proc in psutil.Process().children(recursive=True):
    try:
      leftovers.append(f'{proc.pid} {proc.name()}')
      proc.kill()
    except psutil.NoSuchProcess:
      pass
  return leftovers


def _node_errors(errors_dir: str) -> Dict[str, str]:
  """The tracebacks the failed nodes recorded, by node."""
  errors = {}
  if os.path.isdir(errors_dir):
    for name in sorted(os.listdir(errors_dir)):
      with open(os.path.join(errors_dir, name)) as f:
        errors[name] = f.read()
  return errors


def _launch(settings: ProgramSettings) -> Dict[str, Any]:
  import launchpad as lp

  from experiments.layouts.distributed import supervisor

  run, dist = settings.run, settings.dist
  log_dir = _node_log_dir(settings)
  program = build_program(settings)
  init_file = lp_init.write_init_file(settings.launch_dir)
  resources = local_resources(settings, init_file, list(program.groups))
  log(f'[run] {run.task} size={settings.config.size} actors={dist.num_actors} x '
       f'{settings.envs_per_actor} envs, train_ratio={settings.config.train_ratio:g}, '
       f'target {run.env_steps} env steps, logdir={run.logdir}'
       + (f', node logs in {log_dir}' if dist.terminal == 'output_to_files'
          else ''))
  t0 = time.time()

  errors_dir = os.path.join(settings.launch_dir, stopping.ERRORS_DIR)
  manager_box: Dict[str, Any] = {}
  make_manager = _manager_factory(settings, errors_dir, manager_box)

  with supervisor.installed(make_manager):
    manager = lp.launch(program, launch_type='local_mp',
                        terminal=dist.terminal, local_resources=resources)
  if not settings.sealed and dist.isolation != 'off':
    log(seal.open_ports_line(settings.unsealed, open_ports(settings, program)))
  # Launchpad bound the nodes' addresses at launch: remote learner peers
  # can now be told this launch's Reverb port.
  peers_file = None
  if dist.remote_learner_processes:
    peers_file = remote_peers.publish(settings, parse_address(
        program.groups['replay'][0].reverb_address.resolve())[1],
        ensure_secret(secret_path(run.logdir, dist.join_secret_file)))
  # Launchpad's last resort after the termination notice kills the launcher
  # too; keep it alive so it can report and clean up (workers still die).
  manager._kill_main_thread = False  # noqa: SLF001
  box: Dict[str, Any] = {}
  error = _wait(manager, run, t0)
  if error is not None:
    box['error'] = error
  leftovers = _kill_leftovers()
  errors = _node_errors(errors_dir)
  summary_path = os.path.join(settings.launch_dir, stopping.SUMMARY_FILE)
  summary = (rundir.read_json(summary_path) if os.path.exists(summary_path)
             else None)
  supervised = manager_box.get('m')
  if supervised is not None:
    supervised.close()
  if peers_file and os.path.exists(peers_file):
    os.remove(peers_file)       # this launch is over
  if leftovers:
    log(f'[run] killed processes left after the stop: {leftovers}')
  fatal = supervised.fatal if supervised is not None else None
  if errors or 'error' in box or fatal is not None:
    fatal = supervised.culprit() if supervised is not None else None
    detail = '\n'.join(f'--- {k} ---\n{v}' for k, v in errors.items())
    raise NodeFailed(
        f'a node failed ({fatal.report() if fatal else box.get("error") or "see below"}); '
        f'node logs in {log_dir}\n{detail}', fatal,
        final=any(e in text for e in FINAL_ERRORS for text in errors.values()))
  wall = time.time() - t0
  if summary is None:
    ckpt = rundir.latest_run_checkpoint(run.logdir)
    log(f'[run] stopped by a signal after {wall:.0f}s; last checkpoint '
         f'{ckpt or "none"}; rerun the same command to resume')
    return {'stopped_by': 'signal', 'checkpoint': ckpt, 'wall_s': wall,
            'leftover_processes': leftovers}
  summary['wall_s'] = wall
  summary['leftover_processes'] = leftovers
  log(f'[done] {summary["env_steps"]} env steps, {summary["updates"]} '
       f'updates in {wall:.0f}s; checkpoint {summary["checkpoint"]}')
  return summary
