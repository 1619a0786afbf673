r"""Train DreamerV3 on a dm_control task (synchronous Acme loop, Algorithm K).

  python experiments/run_dmc.py --flagfile=experiments/flags/quickstart.flags
  python experiments/run_dmc.py --flagfile=experiments/flags/dmc_proprio.flags \
      --task=walker_walk --seed=1 --logdir=runs/walker_walk/1

Re-running the same command with the same --logdir resumes from the last
checkpoint (see experiments/train.py; the run directory layout and metric
names are in docs/metrics.md). Ctrl-C (SIGINT) or SIGTERM saves a checkpoint
and exits; a second Ctrl-C stops at once.

Units: --env_steps, --eval_every, --log_every count env steps (agent steps x
--action_repeat, the spec 7.5 x-axis); --checkpoint_every and
--progress_every are seconds of wall time.

Flag names are stable; flags.txt in the run directory lists the ones used
and works as a --flagfile.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys

from absl import app, flags

if __package__ in (None, ''):  # run as a script: make the repo root importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.config import COMPUTE_DTYPES, SIZE_PRESETS, DreamerConfig  # noqa: E402

# Flags that map onto DreamerConfig fields directly (flag name == field name).
CONFIG_FLAGS = ('size', 'train_ratio', 'seed', 'compute_dtype', 'batch_size',
                'batch_length', 'replay_capacity')
FLAG_NAMES = (
    'suite', 'task', 'size', 'train_ratio', 'action_repeat', 'num_envs', 'env_steps',
    'seed', 'logdir', 'compute_dtype', 'eval_every', 'eval_episodes',
    'eval_policy', 'checkpoint_every', 'log_every', 'learner_log_every',
    'progress_every',
    'batch_size', 'batch_length', 'replay_capacity', 'train_fill', 'time_limit',
    'chunk_length', 'config_overrides', 'learner_prefetch', 'report',
    'jax_cache_dir')
MAX_SEED = 1_000_000   # env seeds are (seed + offsets) * 1000 + i < 2**32


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the run flags (and their validators) on ``fv``."""
  F = dict(flag_values=fv)
  flags.DEFINE_enum('suite', 'dmc', ['dmc', 'gym'],
                    'Where --task comes from: dm_control or gym 0.26 '
                    '(experiments/suites.py).', **F)
  flags.DEFINE_string('task', 'walker_walk',
                      'dmc: task "domain_task" (spec 7.5 list in '
                      'experiments/envs.py); gym: a task id like CartPole-v1.', **F)
  flags.DEFINE_enum('size', 'size12m', sorted(SIZE_PRESETS),
                    'Model size preset (spec 2.1); paper protocol size12m.', **F)
  flags.DEFINE_float('train_ratio', 512.0,
                     'Replayed steps trained per agent step (spec 6.1); 512 = paper.', **F)
  flags.DEFINE_integer('action_repeat', 2, 'Action repeat (spec 7.5).', **F)
  flags.DEFINE_integer('num_envs', 16, 'Lock-stepped training envs (spec 7.5).', **F)
  flags.DEFINE_integer('env_steps', 500_000,
                       'Training budget in env steps (agent steps x repeat).', **F)
  flags.DEFINE_integer('seed', 0, 'Seed of params, policy, envs and update rng '
                       '(replay sampling is unseeded, docs/deviations.md).', **F)
  flags.DEFINE_string('logdir', None, 'Run directory (resumed if it holds a '
                      'checkpoint).', **F)
  flags.DEFINE_enum('compute_dtype', 'float32', list(COMPUTE_DTYPES),
                    'Compute dtype (spec 1.12); float32 on CPU.', **F)
  flags.DEFINE_integer('eval_every', 50_000,
                       'Env steps between evaluations (0: only at the end).', **F)
  flags.DEFINE_integer('eval_episodes', 4,
                       'Eval episodes per evaluation, one per eval env (0: no eval).', **F)
  flags.DEFINE_enum('eval_policy', 'sample', ['sample', 'mode'],
                    "Eval policy: 'sample' as the paper (spec 7.3) or 'mode' "
                    '(deterministic).', **F)
  flags.DEFINE_float('checkpoint_every', 600.0,
                     'Seconds of wall time between checkpoints (also one at the end).', **F)
  flags.DEFINE_integer('log_every', 10_000,
                       'Env steps between metrics.jsonl / TensorBoard rows.', **F)
  flags.DEFINE_integer('learner_log_every', 0,
                       "Updates between 'learner' rows in metrics.jsonl: the "
                       'means of the learner metrics over exactly that many '
                       'updates, keyed by update count (bench/parity.py); '
                       '0 = none.', **F)
  flags.DEFINE_float('progress_every', 10.0, 'Seconds between progress lines.', **F)
  flags.DEFINE_integer('batch_size', 16, 'B (spec Table 4).', **F)
  flags.DEFINE_integer('batch_length', 64, 'T trained steps per row (spec 5.1).', **F)
  flags.DEFINE_integer('replay_capacity', 5_000_000, 'Replay items (spec 5.1).', **F)
  flags.DEFINE_integer('train_fill', 0,
                       'Items before training starts; 0 = B*T (spec 6.2).', **F)
  flags.DEFINE_float('time_limit', None,
                     'Episode length in simulated seconds (tests); default the '
                     "task's own (1000 control steps).", **F)
  flags.DEFINE_integer('chunk_length', 0, 'Reverb chunk length of the adder '
                       '(0: the WindowAdder default).', **F)
  flags.DEFINE_multi_string('config_overrides', [],
                            'Extra DreamerConfig fields as name=value '
                            '(e.g. lr=1e-4); see agent/config.py.', **F)
  flags.DEFINE_bool('learner_prefetch', True, 'The learner samples its next '
                    'batch during the current update (spec 6.3b); false keeps '
                    'the strict synchronous order.', **F)
  flags.DEFINE_bool('report', True, 'Write report.png (experiments/report.py) '
                    'at the end.', **F)
  flags.DEFINE_string('jax_cache_dir', None,
                      'Persistent XLA compilation cache (a resumed run skips '
                      'recompiling); default <logdir>/jax_cache, "off" disables.',
                      **F)

  def v(name, check, msg):
    flags.register_validator(name, check, message=f'--{name} {msg}', **F)

  flags.register_multi_flags_validator(
      ['suite', 'task'], _task_ok, flag_values=fv,
      message='--task must be a task of --suite: dmc such as walker_walk (run '
      '`python -c "from experiments import envs; print(envs.all_task_names())"`), '
      'gym such as CartPole-v1 or Pendulum-v1')
  flags.register_multi_flags_validator(
      ['suite', 'time_limit'],
      lambda d: d['suite'] == 'dmc' or d['time_limit'] is None, flag_values=fv,
      message='--time_limit (simulated seconds) is a dm_control setting; gym '
      'tasks end by their own TimeLimit')
  v('train_ratio', lambda x: x is not None and x > 0, 'must be > 0')
  v('action_repeat', lambda x: x is not None and x >= 1, 'must be >= 1')
  v('num_envs', lambda x: x is not None and 1 <= x <= 1000, 'must be in [1, 1000]')
  v('env_steps', lambda x: x is not None and x > 0, 'must be > 0')
  v('seed', lambda x: x is not None and 0 <= x < MAX_SEED,
    f'must be in [0, {MAX_SEED})')
  v('logdir', lambda x: bool(x), 'is required (the run directory)')
  v('eval_every', lambda x: x is not None and x >= 0, 'must be >= 0')
  v('eval_episodes', lambda x: x is not None and 0 <= x <= 1000,
    'must be in [0, 1000]')
  v('checkpoint_every', lambda x: x is not None and x > 0, 'must be > 0 seconds')
  v('log_every', lambda x: x is not None and x > 0, 'must be > 0 env steps')
  v('learner_log_every', lambda x: x is not None and x >= 0,
    'must be >= 0 updates (0: no learner rows)')
  v('progress_every', lambda x: x is not None and x > 0, 'must be > 0 seconds')
  v('batch_size', lambda x: x is not None and x >= 1, 'must be >= 1')
  v('batch_length', lambda x: x is not None and x >= 2, 'must be >= 2')
  v('replay_capacity', lambda x: x is not None and x >= 1, 'must be >= 1')
  v('train_fill', lambda x: x is not None and x >= 0, 'must be >= 0')
  v('time_limit', lambda x: x is None or x > 0, 'must be > 0 seconds')
  v('chunk_length', lambda x: x is not None and x >= 0, 'must be >= 0')
  v('config_overrides', _overrides_ok,
    'entries must be name=value with a DreamerConfig field name (not one that '
    'has its own flag) and a value of that field\'s type')


def _task_ok(values) -> bool:
  from experiments.suites import check_task
  try:
    check_task(values['suite'], values['task'])
  except ValueError:
    return False
  return True


def _field_types():
  """{DreamerConfig field: the Python type of its default} (None: Optional)."""
  return {f.name: type(f.default) for f in dataclasses.fields(DreamerConfig)}


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


# field type -> (accepts, converts, what to ask for)
_TYPE_RULES = {
    type(None): (lambda v: v is None or _is_int(v), lambda v: v,
                 'an integer or None'),        # Optional[int] (units_override)
    bool: (lambda v: isinstance(v, bool), bool, 'a bool (True or False)'),
    int: (lambda v: _is_int(v) or (isinstance(v, float) and v.is_integer()),
          int, 'an integer'),
    float: (lambda v: _is_int(v) or isinstance(v, float), float, 'a number'),
    str: (lambda v: isinstance(v, str), str, 'a string'),
    tuple: (lambda v: isinstance(v, (tuple, list)), tuple, 'a tuple'),
}


def _typed(name: str, value, kind):
  """``value`` as field ``name``'s type ``kind``; ValueError naming both."""
  if kind not in _TYPE_RULES:
    return value
  accepts, convert, want = _TYPE_RULES[kind]
  if accepts(value):
    return convert(value)
  raise ValueError(f'--config_overrides: {name}={value!r} must be {want} '
                   f'(DreamerConfig.{name} is {kind.__name__})')


def parse_overrides(entries) -> dict:
  """['lr=1e-4', 'online_queue=False'] -> {'lr': 1e-4, 'online_queue': False}.

  Each value is checked against the DreamerConfig field's type before
  anything is built or written (ValueError naming the field)."""
  types = _field_types()
  out = {}
  for entry in entries or []:
    if '=' not in entry:
      raise ValueError(f'--config_overrides entry {entry!r} is not name=value')
    name, raw = entry.split('=', 1)
    name = name.strip()
    if name not in types:
      raise ValueError(f'--config_overrides: unknown DreamerConfig field {name!r}')
    if name in CONFIG_FLAGS or name == 'train_fill':
      raise ValueError(f'--config_overrides: set {name!r} with --{name}')
    try:
      value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
      value = raw.strip()            # bare strings, e.g. latent_store_dtype=float32
    out[name] = _typed(name, value, types[name])
  return out


def _overrides_ok(entries) -> bool:
  try:
    parse_overrides(entries)
  except ValueError as e:        # the message names the field and its type
    raise flags.ValidationError(str(e)) from e
  return True


def configs_from_flags(fv: flags.FlagValues = flags.FLAGS):
  """(RunConfig, DreamerConfig) from parsed flags; ValueError names the flag."""
  from agent.config import make_config
  from experiments.rundir import RunConfig
  kw = {name: fv[name].value for name in CONFIG_FLAGS}
  kw['train_fill'] = fv.train_fill or fv.batch_size * fv.batch_length
  kw.update(parse_overrides(fv.config_overrides))
  try:
    config = make_config(**kw)
  except ValueError as e:
    raise ValueError(f'invalid configuration from flags: {e}') from e
  if config.batch_size * config.seq_len > config.replay_capacity:
    raise ValueError(f'--replay_capacity {config.replay_capacity} must be >= '
                     f'batch_size * (batch_length + 1) = '
                     f'{config.batch_size * config.seq_len}')
  text = ''.join(fv[name].serialize() + '\n' for name in FLAG_NAMES
                 if fv[name].serialize())
  run = RunConfig(
      suite=fv.suite, task=fv.task, logdir=os.path.abspath(os.path.expanduser(fv.logdir)),
      env_steps=fv.env_steps, num_envs=fv.num_envs,
      action_repeat=fv.action_repeat, eval_every=fv.eval_every,
      eval_episodes=fv.eval_episodes, eval_policy=fv.eval_policy,
      checkpoint_every=fv.checkpoint_every, log_every=fv.log_every,
      learner_log_every=fv.learner_log_every,
      progress_every=fv.progress_every, time_limit=fv.time_limit,
      chunk_length=fv.chunk_length or None, prefetch=fv.learner_prefetch,
      report=fv.report, flags_text=text)
  return run, config


def train(env_factory, *, task: str, logdir: str, flagfile: str = None,
          distributed: bool = False, **flag_values):
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
  (``experiments.protocol_env``). ``task`` names the run (logs, reports).
  ``flagfile`` and the keyword arguments are run_dmc.py's flags (same names
  and meaning; ``--suite``, ``--task`` and ``--time_limit`` do not apply).
  Bad values raise ValueError (or ``flags.ValidationError``) before anything
  is written. ``distributed=True`` runs the Launchpad program instead; then
  the factory must be picklable (a module-level function). Re-running with
  the same ``logdir`` and factory resumes.
  """
  from experiments import launch_dmc, rundir
  from experiments import train as train_lib
  fv = flags.FlagValues()
  define_flags(fv)
  launch_dmc.define_distributed_flags(fv)
  bad = sorted((set(flag_values) - set(fv)) |
               ({'suite', 'task', 'time_limit', 'logdir'} & set(flag_values)))
  if bad:
    raise ValueError(f'train(): {bad} are not run flags here (see run_dmc.py '
                     '--help; suite, task, time_limit and logdir do not apply)')
  fv(['train'] + ([f'--flagfile={flagfile}'] if flagfile else []) +
     [f'--logdir={logdir}'])
  for name, value in flag_values.items():
    setattr(fv, name, value)           # runs the flag's validators
  fv.time_limit = None
  run, config = configs_from_flags(fv)
  text = ''.join(line + '\n' for line in run.flags_text.splitlines()
                 if not line.startswith(('--suite=', '--task=', '--time_limit=')))
  run = dataclasses.replace(
      run, suite='custom', task=str(task), env_factory=env_factory,
      flags_text=f'# suite custom (experiments.run_dmc.train), task {task}\n' + text)
  if distributed:
    dist = launch_dmc.dist_config_from_flags(fv)
    run = dataclasses.replace(run, flags_text=run.flags_text + ''.join(
        fv[name].serialize() + '\n' for name in launch_dmc.DIST_FLAG_NAMES))
    if run.num_envs % dist.num_actors:
      raise ValueError(f'num_envs {run.num_envs} must be a multiple of '
                       f'num_actors {dist.num_actors}')
    return launch_dmc.launch(run, config, dist)
  trainer = train_lib.Trainer(run, config)
  cache = fv.jax_cache_dir
  if cache != 'off':
    rundir.enable_compilation_cache(cache or os.path.join(run.logdir, 'jax_cache'))
  try:
    return trainer.run()
  finally:
    trainer.close()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  from experiments import rundir
  from experiments import train as train_lib
  try:
    run, config = configs_from_flags(flags.FLAGS)
    trainer = train_lib.Trainer(run, config)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  cache = flags.FLAGS.jax_cache_dir
  if cache != 'off':
    rundir.enable_compilation_cache(cache or os.path.join(run.logdir, 'jax_cache'))
  try:
    summary = trainer.run()
  except ValueError as e:   # e.g. NonFiniteActionError; last checkpoint intact
    last = rundir.latest_run_checkpoint(run.logdir)
    print(f'error: {e}\nThe last checkpoint ({last or "none"}) is untouched.',
          file=sys.stderr)
    return 3
  finally:
    trainer.close()
  print(f'[run_dmc] {summary["env_steps"]} env steps, {summary["updates"]} '
        f'updates, {summary["episodes"]} episodes, last scores '
        f'{[round(s, 1) for s in summary["recent_scores"]]}', file=sys.stderr)
  return 0


if __name__ == '__main__':
  define_flags()
  # --distributed: the same run as a Launchpad local_mp program
  # (experiments/launch_dmc.py, docs/deviations.md "Distributed runs").
  from experiments import launch_dmc  # noqa: E402
  launch_dmc.define_distributed_flags()
  app.run(launch_dmc.dispatch(main))
