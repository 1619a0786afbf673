r"""Train DreamerV3 on a dm_control task as a Launchpad program (local_mp).

  python experiments/launch_dmc.py --flagfile=experiments/flags/dmc_proprio.flags \
      --task=walker_walk --num_actors=4 --logdir=runs/walker_walk_lp
  python experiments/run_dmc.py --flagfile=... --distributed --num_actors=4   # same

Every run_dmc.py flag means the same here, except that ``--num_envs`` is the
total number of training envs, split evenly over ``--num_actors`` actor
processes (so the paper's 16 envs stay 16 envs). The program is
``experiments.distributed.build_program``: a Reverb node (rate limiter
'ratio'), a learner, the actors, a counter, an evaluator and a step limiter,
each in its own process. Each node's output goes to
``<logdir>/lp_logs/segment-<n>/<group>/<index>`` (``--lp_terminal=
output_to_files``, the default) or to this terminal (``current_terminal``).

Re-running with the same ``--logdir`` resumes from the last checkpoint.
Ctrl-C (or SIGTERM) stops every node; the learner writes a checkpoint first
(within ``--stop_grace`` seconds). A second Ctrl-C kills at once. The step
budget stops the program by itself (final checkpoint, final evaluation).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Optional

from absl import app, flags

if __package__ in (None, ''):  # run as a script: make the repo root importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent  # noqa: F401,E402  (jax compat before acme)

DIST_FLAG_NAMES = ('num_actors', 'actor_update_period', 'lp_terminal',
                   'stop_grace')


def define_distributed_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
  """Flags of the distributed launch (also used by run_dmc.py's hook)."""
  F = dict(flag_values=fv)
  flags.DEFINE_bool('distributed', False, 'run_dmc.py: run as a Launchpad '
                    'local_mp program (experiments/launch_dmc.py).', **F)
  flags.DEFINE_integer('num_actors', 2, 'Actor processes; each steps '
                       'num_envs / num_actors envs.', **F)
  flags.DEFINE_integer('actor_update_period', 1, 'Actor vector steps between '
                       'parameter fetches (acme VariableClient update_period).',
                       **F)
  flags.DEFINE_enum('lp_terminal', 'output_to_files',
                    ['output_to_files', 'current_terminal'],
                    'Where node output goes (Launchpad local_mp terminal).', **F)
  flags.DEFINE_float('stop_grace', 60.0, 'Seconds nodes wait for the learner\'s '
                     'final checkpoint after a stop signal.', **F)

  def v(name, check, msg):
    flags.register_validator(name, check, message=f'--{name} {msg}', **F)

  v('num_actors', lambda x: x is not None and 1 <= x <= 256, 'must be in [1, 256]')
  v('actor_update_period', lambda x: x is not None and x >= 1, 'must be >= 1')
  v('stop_grace', lambda x: x is not None and x > 0, 'must be > 0 seconds')


def dist_config_from_flags(fv: flags.FlagValues = flags.FLAGS):
  from experiments.distributed import DistributedConfig
  return DistributedConfig(
      num_actors=fv.num_actors, update_period=fv.actor_update_period,
      terminal=fv.lp_terminal, stop_grace_s=fv.stop_grace)


def configs_from_flags(fv: flags.FlagValues = flags.FLAGS):
  """(RunConfig, DreamerConfig, DistributedConfig); ValueError names the flag."""
  from experiments import run_dmc
  run, config = run_dmc.configs_from_flags(fv)
  dist = dist_config_from_flags(fv)
  if run.num_envs % dist.num_actors:
    raise ValueError(f'--num_envs {run.num_envs} (total training envs) must be '
                     f'a multiple of --num_actors {dist.num_actors}')
  text = run.flags_text + ''.join(fv[name].serialize() + '\n'
                                  for name in DIST_FLAG_NAMES)
  return dataclasses.replace(run, flags_text=text), config, dist


# --- launch -----------------------------------------------------------------------


def _last_train_row(path: str) -> Optional[Dict[str, Any]]:
  if not os.path.exists(path):
    return None
  with open(path, 'rb') as f:
    f.seek(max(0, os.path.getsize(path) - 65536))
    lines = f.read().decode(errors='replace').splitlines()
  for line in reversed(lines):
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if row.get('kind') == 'train':
      return row
  return None


def progress_line(row: Optional[Dict[str, Any]], target: int, wall: float) -> str:
  from experiments import rundir
  if not row:
    return f'[run] 0/{target} env steps (starting: replay fill / compilation)'

  def fmt(key, spec='.1f'):
    x = row.get(key)
    return '-' if x is None else format(x, spec)

  extra = (f' | replay ratio {fmt("replay/ratio_all_rows_window")} (target '
           f'{row.get("replay/ratio_target", 0):g}) | learner idle '
           f'{fmt("learner/idle_frac", ".0%")} | param lag '
           f'{fmt("actor/param_lag_updates_mean")} updates')
  score = row.get('episode/recent_score_mean')
  return rundir.progress_line(row['env_step'], target, row['updates'],
                              row.get('fps/env_steps_per_s') or 0.0, wall,
                              [] if score is None else [score], extra)


def prepare(run, config, dist):
  """Checks the logdir and the checkpoint to resume; returns a ProgramSpec,
  or a summary dict when the budget was already reached."""
  from experiments import rundir
  from experiments.distributed import MODE, ProgramSpec
  latest = rundir.validate(run, config, MODE)
  state = rundir.prepare(run, latest)
  rundir.start_segment(run, state)
  if state and state['counts'].get('env_steps', 0) >= run.env_steps:
    return {'checkpoint': latest, 'env_steps': state['counts']['env_steps'],
            'updates': state['learner']['updates'], 'already_done': True}
  env = run.make_env(1, seed=0)
  spaces = env.spaces
  env.close()
  segment = state['segment'] + 1 if state else 0
  spec = ProgramSpec(run=run, config=config, dist=dist, spaces=spaces,
                     launch_dir=tempfile.mkdtemp(prefix='dreamer-lp-'),
                     segment=segment, resume=latest, run_state=state)
  if latest:
    rundir.log(f'[run] resuming from {latest} (segment {segment}, '
               f'{state["counts"].get("env_steps", 0)} env steps, '
               f'{state["learner"]["updates"]} updates)')
  return spec


def launch(run, config, dist) -> Dict[str, Any]:
  """Runs the program to the step budget (or a stop signal); returns a
  summary. Raises RuntimeError when a node failed."""
  spec_or_done = prepare(run, config, dist)
  if isinstance(spec_or_done, dict):
    from experiments import rundir
    rundir.log(f'[run] {run.logdir} already reached {spec_or_done["env_steps"]} env '
         'steps; nothing to train')
    return spec_or_done
  spec = spec_or_done
  try:
    return _launch(spec)
  finally:
    shutil.rmtree(spec.launch_dir, ignore_errors=True)


def _launch(spec) -> Dict[str, Any]:
  import launchpad as lp
  import psutil
  from launchpad.launch.run_locally import launch_local_output_to_files

  from experiments import distributed, lp_init, rundir

  run, dist = spec.run, spec.dist
  fv = flags.FLAGS
  if not fv.is_parsed():
    fv.mark_as_parsed()
  fv.lp_termination_notice_secs = dist.termination_notice_s
  log_dir = os.path.join(run.logdir, 'lp_logs', f'segment-{spec.segment}')
  launch_local_output_to_files._LOGGING_DIR = log_dir  # noqa: SLF001
  program = distributed.build_program(spec)
  init_file = lp_init.write_init_file(spec.launch_dir)
  resources = distributed.local_resources(spec, init_file, list(program.groups))
  rundir.log(f'[run] {run.task} size={spec.config.size} actors={dist.num_actors} x '
       f'{spec.envs_per_actor} envs, train_ratio={spec.config.train_ratio:g}, '
       f'target {run.env_steps} env steps, logdir={run.logdir}'
       + (f', node logs in {log_dir}' if dist.terminal == 'output_to_files'
          else ''))
  t0 = time.time()
  manager = lp.launch(program, launch_type='local_mp', terminal=dist.terminal,
                      local_resources=resources)
  # Launchpad's last resort after the termination notice kills the launcher
  # too; keep it alive so it can report and clean up (workers still die).
  manager._kill_main_thread = False  # noqa: SLF001
  box: Dict[str, Any] = {}

  def wait():
    try:
      manager.wait()
    except BaseException as e:  # noqa: BLE001  (reported below)
      box['error'] = e

  waiter = threading.Thread(target=wait, name='lp-wait', daemon=True)
  waiter.start()
  metrics = os.path.join(run.logdir, rundir.METRICS_FILE)
  while waiter.is_alive():
    waiter.join(run.progress_every)
    if waiter.is_alive() and run.verbose:
      rundir.log(progress_line(_last_train_row(metrics), run.env_steps,
                               time.time() - t0))
  leftovers = []
  for proc in psutil.Process().children(recursive=True):
    try:
      leftovers.append(f'{proc.pid} {proc.name()}')
      proc.kill()
    except psutil.NoSuchProcess:
      pass
  errors = {}
  errors_dir = os.path.join(spec.launch_dir, distributed.ERRORS_DIR)
  if os.path.isdir(errors_dir):
    for name in sorted(os.listdir(errors_dir)):
      with open(os.path.join(errors_dir, name)) as f:
        errors[name] = f.read()
  summary_path = os.path.join(spec.launch_dir, distributed.SUMMARY_FILE)
  summary = (rundir.read_json(summary_path) if os.path.exists(summary_path)
             else None)
  if leftovers:
    rundir.log(f'[run] killed processes left after the stop: {leftovers}')
  if errors or 'error' in box:
    detail = '\n'.join(f'--- {k} ---\n{v}' for k, v in errors.items())
    raise RuntimeError(
        f'a node failed ({box.get("error") or "see below"}); node logs in '
        f'{log_dir}\n{detail}')
  wall = time.time() - t0
  if summary is None:
    ckpt = rundir.latest_run_checkpoint(run.logdir)
    rundir.log(f'[run] stopped by a signal after {wall:.0f}s; last checkpoint '
         f'{ckpt or "none"}; rerun the same command to resume')
    return {'stopped_by': 'signal', 'checkpoint': ckpt, 'wall_s': wall,
            'leftover_processes': leftovers}
  summary['wall_s'] = wall
  summary['leftover_processes'] = leftovers
  rundir.log(f'[done] {summary["env_steps"]} env steps, {summary["updates"]} '
       f'updates in {wall:.0f}s; checkpoint {summary["checkpoint"]}')
  if run.report:
    from experiments.report import make_report
    try:
      rundir.log(make_report(run.logdir, os.path.join(run.logdir,
                                                      rundir.REPORT_FILE)))
    except (FileNotFoundError, ValueError) as e:
      rundir.log(f'[report] skipped: {e}')
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    run, config, dist = configs_from_flags(flags.FLAGS)
    summary = launch(run, config, dist)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  except RuntimeError as e:
    print(f'error: {e}', file=sys.stderr)
    return 3
  del summary
  return 0


def dispatch(single_process_main):
  """run_dmc.py's hook: ``app.run(dispatch(main))`` runs ``main`` unless
  ``--distributed`` is set."""
  def entry(argv):
    if flags.FLAGS.distributed:
      return main(argv)
    return single_process_main(argv)
  return entry


if __name__ == '__main__':
  from experiments import run_dmc
  run_dmc.define_flags()
  define_distributed_flags()
  app.run(main)
