r"""Train DreamerV3: the one command line, both layouts, every suite.

  python experiments/run_dmc.py --flagfile=experiments/flags/quickstart.flags
  python experiments/run_dmc.py --flagfile=experiments/flags/dmc_proprio.flags \
      --task=walker_walk --seed=1 --logdir=runs/walker_walk/1
  python experiments/run_dmc.py --flagfile=... --distributed --num_actors=4
  python experiments/run_dmc.py --suite=gym --task=CartPole-v1 ...
  python experiments/run_dmc.py --distributed --join=HOST:PORT --num_envs=4
  python experiments/run_dmc.py --distributed --learner_peer=1 --logdir=DIR

Without --distributed the run is one process (experiments/layouts/local.py:
acme's EnvironmentLoop, Algorithm K); with it, a Launchpad program
(experiments/layouts/distributed/); with --join, a remote actor of such a
program running elsewhere (experiments/layouts/distributed/join/); with
--learner_peer, one of its learner processes on another host
(experiments/layouts/distributed/remote_peers.py). Flags, their checks and
the configs they make: experiments/options.py; the experiment the configs
make: experiments/run/experiment.py.
``train(env_factory, ...)`` below runs your own environment with the same
flags.

Re-running the same command with the same --logdir resumes from the last
checkpoint (the run directory layout and metric names are in
docs/metrics.md). Ctrl-C (SIGINT) or SIGTERM saves a checkpoint
and exits; a second Ctrl-C stops at once.

Units: --env_steps, --eval_every, --log_every count env steps (agent steps x
--action_repeat, the spec 7.5 x-axis); --checkpoint_every and
--progress_every are seconds of wall time.

Flag names are stable; flags.txt in the run directory lists the ones used
and works as a --flagfile.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable, Dict

from absl import app, flags

if __package__ in (None, ''):  # run as a script: make the repo root importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments import options  # noqa: E402
from experiments.envs.protocol import did_you_mean  # noqa: E402
from experiments.layouts import local  # noqa: E402
from experiments.layouts.distributed import launch, remote_peers  # noqa: E402
from experiments.layouts.distributed.join import remote  # noqa: E402
from experiments.run import private_files, rundir  # noqa: E402
from experiments.run.experiment import (  # noqa: E402
    DreamerExperiment, make_experiment)
from experiments.options import (  # noqa: E402
    FLAG_NAMES, configs_from_flags, experiment_from_flags, join_workers)
from experiments.program_flags import (  # noqa: E402
    DIST_FLAG_NAMES, JOIN_FLAG_NAMES, PEER_FLAG_NAMES)
from experiments.tools import report  # noqa: E402


def _only(fv: flags.FlagValues, allowed, what: str, usage: str) -> None:
  """ValueError naming the run flags set beyond ``allowed``: ``what`` runs
  the program's settings, not its own."""
  others = sorted(name for name in fv if fv[name].present and
                  name in FLAG_NAMES + DIST_FLAG_NAMES and name not in allowed)
  if others:
    raise ValueError(
        f'{what} takes the running program\'s settings; these flags are not '
        f'its own: {", ".join("--" + n for n in others)} (pass only {usage})')
  if not fv.distributed:
    raise ValueError(f'{what} needs --distributed (it joins a Launchpad '
                     'program)')


def join_args_from_flags(fv: flags.FlagValues = flags.FLAGS):
  """(address, num_envs, secret file) of a remote actor (``--join``);
  ValueError naming any other flag that was set: a remote actor runs the
  program's settings."""
  _only(fv, JOIN_FLAG_NAMES, '--join',
        '--distributed --join=HOST:PORT --num_envs=N [--join_secret_file=F]')
  return fv.join, fv.num_envs, fv.join_secret_file


def peer_args_from_flags(fv: flags.FlagValues = flags.FLAGS):
  """(logdir, process id, bind, secret file) of a remote learner process
  (``--learner_peer``); ValueError as ``join_args_from_flags``. When the id
  comes from ``$JAX_PROCESS_ID`` (the same command line on every host), the
  program's own flags on it are ignored rather than refused."""
  if fv['learner_peer'].present:
    _only(fv, PEER_FLAG_NAMES, '--learner_peer',
          '--distributed --learner_peer=K --logdir=DIR --bind=HOST '
          '[--join_secret_file=F]')
  elif not fv.distributed:
    raise ValueError('$JAX_PROCESS_ID >= 1 runs a remote learner process, '
                     'which needs --distributed')
  if not fv.logdir:
    raise ValueError('--learner_peer needs --logdir: the program\'s run '
                     'directory, shared at the same path')
  if not fv.bind:
    raise ValueError('--learner_peer needs --bind=HOST, the address the '
                     "program's learner process 0 reaches this host at (its "
                     'gloo collectives listen there)')
  return (os.path.abspath(os.path.expanduser(fv.logdir)), fv.learner_peer,
          fv.bind, fv.join_secret_file)


# Flags that make no sense for train(env_factory, ...): the env comes from the
# factory, and the logdir is an argument.
NOT_TRAIN_FLAGS = ('suite', 'task', 'time_limit', 'logdir')


def start(experiment: DreamerExperiment,
          dist=None) -> Callable[[], Dict[str, Any]]:
  """Validates the run for its layout (``dist``: the Launchpad program's
  settings, or None for one process; ValueError naming the problem, before
  anything is written) and returns the function that runs it: the layout to
  the budget (or a stop signal), then the report, returning the summary."""
  private_files.restrict_umask()    # run files: writable by this user only
  run = experiment.run
  if dist is not None:
    prepared = launch.prepare(experiment, dist)

    def go() -> Dict[str, Any]:
      return launch.run(prepared)
  else:
    trainer = local.Trainer(experiment)

    def go() -> Dict[str, Any]:
      try:
        return trainer.run()
      finally:
        trainer.close()

  def run_and_report() -> Dict[str, Any]:
    summary = go()
    stopped = (summary.get('stopped') or
               summary.get('stopped_by') == 'signal')
    if run.report and not stopped and not summary.get('already_done'):
      summary['report'] = report.write_run_report(
          run.logdir, report.anchor_file(run.image, run.suite))
    return summary
  return run_and_report


def train(env_factory, *, task: str, logdir: str, flagfile: str = None,
          distributed: bool = False, **flag_values) -> Dict[str, Any]:
  """Trains DreamerV3 on your own environment; returns the run's summary dict.

    import dm_env
    from experiments.run_dmc import train

    def make_env(seed: int) -> dm_env.Environment:
      return MyEnv(seed=seed)        # vector obs, bounded or discrete actions

    train(make_env, task='my_env', logdir='runs/my_env',
          flagfile='experiments/flags/quickstart.flags', env_steps=50_000)

  ``env_factory(seed)`` makes one env (called once per training env, with the
  seeds a dm_control run would get, and for the eval envs); any
  ``dm_env.Environment`` with vector observations (an array, or a dict of
  arrays) and a bounded continuous or a discrete action spec works
  (``experiments.envs.protocol``). ``task`` names the run (logs, reports).
  ``flagfile`` and the keyword arguments are run_dmc.py's flags (same names
  and meaning; ``--suite``, ``--task`` and ``--time_limit`` do not apply).
  Bad values raise ValueError (or ``flags.ValidationError``) before anything
  is written. ``distributed=True`` runs the Launchpad program instead; then
  the factory must be picklable (a module-level function). Re-running with
  the same ``logdir`` and factory resumes.
  """
  fv = flags.FlagValues()
  options.define_flags(fv)
  bad = sorted((set(flag_values) - set(fv)) |
               (set(NOT_TRAIN_FLAGS) & set(flag_values)))
  if bad:
    # train()'s own keywords and the flags it takes, for "did you mean".
    known = ((set(fv) - {'suite', 'time_limit'}) |
             {'task', 'logdir', 'flagfile', 'distributed'})
    hints = ''.join(f' {name!r}:{did_you_mean(name, known - {name})}'
                    for name in bad if did_you_mean(name, known - {name}))
    raise ValueError(f'train(): {bad} are not run flags here (see run_dmc.py '
                     '--help; suite, task, time_limit and logdir do not apply '
                     f'as flags).{hints}')
  fv(['train'] + ([f'--flagfile={flagfile}'] if flagfile else []) +
     [f'--logdir={logdir}'])
  for name, value in flag_values.items():
    setattr(fv, name, value)           # runs the flag's validators
  fv.time_limit = None
  fv.distributed = bool(distributed)
  run, config, dist = configs_from_flags(fv)
  text = ''.join(line + '\n' for line in run.flags_text.splitlines()
                 if not line.startswith(('--suite=', '--task=', '--time_limit=')))
  run = dataclasses.replace(
      run, suite='custom', task=str(task), env_factory=env_factory,
      flags_text=f'# suite custom (experiments.run_dmc.train), task {task}\n' + text)
  return start(make_experiment(run, config, join_workers(dist)),
               dist)()


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if flags.FLAGS.join or flags.FLAGS.learner_peer:   # part of a program
    try:                                                 # started elsewhere
      if flags.FLAGS.learner_peer and flags.FLAGS.join:
        raise ValueError('--join and --learner_peer: one or the other')
      if flags.FLAGS.join:
        remote.main(*join_args_from_flags(flags.FLAGS))
      else:
        remote_peers.run_remote_peer(*peer_args_from_flags(flags.FLAGS))
    except ValueError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    except RuntimeError as e:
      print(f'error: {e}', file=sys.stderr)
      return 3
    return 0
  try:
    experiment, dist = experiment_from_flags(flags.FLAGS)
    run = experiment.run
    go = start(experiment, dist)
  except ValueError as e:   # bad input: nothing was written
    print(f'error: {e}', file=sys.stderr)
    return 2
  try:
    summary = go()
  except ValueError as e:   # e.g. NonFiniteActionError; last checkpoint intact
    last = rundir.latest_run_checkpoint(run.logdir)
    print(f'error: {e}\nThe last checkpoint ({last or "none"}) is untouched.',
          file=sys.stderr)
    return 3
  except RuntimeError as e:  # a Launchpad node failed
    print(f'error: {e}', file=sys.stderr)
    return 3
  if dist is None:
    print(f'[run_dmc] {summary["env_steps"]} env steps, {summary["updates"]} '
          f'updates, {summary["episodes"]} episodes, last scores '
          f'{[round(s, 1) for s in summary["recent_scores"]]}', file=sys.stderr)
  return 0


HELP_FLAGS = ('--help', '-help', '-?', '--helpshort', '-helpshort')


if __name__ == '__main__':
  try:
    options.define_flags()
  except ValueError as e:    # a malformed $JAX_* variable (program_flags.py)
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  if any(arg in HELP_FLAGS for arg in sys.argv[1:]):
    # absl's --help lists only this module's key flags (none: they are
    # defined in experiments/options.py); this shows every run flag, grouped.
    print(options.help_text(flags.FLAGS, __doc__))
    sys.exit(0)
  app.run(main)
