"""Every run flag, its check, and the configs the parsed flags make (both
layouts), as acme's ``run_*.py`` define their flags beside
``build_experiment_config``.

``define_flags(fv)`` defines the flags of ``experiments/run_dmc.py`` (and of
the ``train()`` API) with their validators, the Launchpad program's from
``experiments.program_flags``; ``help_text(fv)`` is its ``--help``. ``configs_from_flags(fv)``: the ``CONFIG_FLAGS`` become the
DreamerConfig fields of their names (``--train_ratio`` ->
``DreamerConfig.train_ratio`` -> the builder's rate limiter, spec 6.1), the
rest the ``RunConfig`` and, with ``--distributed``, the program's
``DistributedConfig``; ``experiment_from_flags(fv)`` makes the experiment
from them (``experiments.run.experiment.make_experiment``). The arguments of
a remote actor or learner process: ``experiments.run_dmc``. Each rule
lives once: the ranges of the run and of the program in their tables
(``experiments.run.config.RUN_RULES``,
``experiments.layouts.distributed.settings.RULES``; the validators here and
the dataclasses both check them), task / suite / time_limit in
``experiments.envs.suites.check_task``, the actor and device split in
``experiments.layouts.distributed.settings.check_layout``, the
DreamerConfig's own in ``agent.config.make_config``, addresses in
``experiments.layouts.distributed.addresses.parse_address``.

Flag names are stable; flags.txt in a run directory lists the ones used and
works as a --flagfile.
"""

from __future__ import annotations

import functools
import os
from typing import Optional, Tuple

from absl import flags

from agent.actor import POLICY_MODES
from agent.config import (
    COMPUTE_DTYPES, SIZE_PRESETS, DreamerConfig, make_config)
from experiments import program_flags
from experiments.config_overrides import parse_overrides
from experiments.envs import suites
from experiments.layouts.distributed.addresses import parse_address
from experiments.layouts.distributed.settings import (
    RULES, DistributedConfig)
from experiments.run.config import (
    OPTIONAL_RUN_RULES, RUN_RULES, RunConfig, check_max_skipped)
from experiments.run.experiment import DreamerExperiment, make_experiment
from reverb_tables.config import REPLAY_RULES, rule_ok, rule_text
from reverb_tables.step_checks import DEFAULT_VALUE_LIMIT

FLAG_NAMES = (
    'suite', 'task', 'size', 'train_ratio', 'action_repeat', 'num_envs', 'env_steps',
    'seed', 'logdir', 'compute_dtype', 'eval_every', 'eval_episodes',
    'eval_policy', 'checkpoint_every', 'log_every', 'learner_log_every',
    'progress_every',
    'batch_size', 'batch_length', 'replay_capacity', 'train_fill', 'time_limit',
    'image', 'proprio', 'chunk_length', 'config_overrides', 'learner_prefetch',
    'report', 'jax_cache_dir', 'learner_devices', 'policy_device',
    'max_skipped_updates', 'replay_value_limit')
# Flags that set the DreamerConfig field of their name (the agent's config
# from flags: ``configs_from_flags`` below). --train_fill
# sets one too (0 means B*T); --config_overrides may set none of them.
CONFIG_FLAGS = ('size', 'train_ratio', 'seed', 'compute_dtype', 'batch_size',
                'batch_length', 'replay_capacity')
FLAGGED_FIELDS = CONFIG_FLAGS + ('train_fill',)
# What ``run_dmc.py --help`` shows, by group (every flag is in one group).
FLAG_GROUPS = (
    ('task and budget', ('suite', 'task', 'image', 'proprio', 'env_steps',
                         'num_envs', 'action_repeat', 'time_limit', 'seed',
                         'logdir')),
    ('model', ('size', 'compute_dtype', 'batch_size', 'batch_length',
               'config_overrides', 'learner_devices', 'policy_device')),
    ('replay', ('train_ratio', 'replay_capacity', 'train_fill',
                'chunk_length', 'learner_prefetch', 'replay_value_limit')),
    ('evaluation, logs and checkpoints', (
        'eval_every', 'eval_episodes', 'eval_policy', 'log_every',
        'learner_log_every', 'progress_every', 'checkpoint_every', 'report',
        'jax_cache_dir', 'max_skipped_updates')),
    ('layout: Launchpad program (--distributed)', (
        'distributed', 'num_actors', 'actor_update_period', 'lp_terminal',
        'stop_grace', 'max_restarts', 'learner_processes',
        'coordinator_address', 'isolation')),
    ('remote hosts (docs/security.md)', (
        'join_slots', 'join_port', 'bind', 'join_lease', 'join_max_envs',
        'join_secret_file', 'join', 'remote_learner_processes',
        'learner_peer')),
)


def help_text(fv: flags.FlagValues, usage: str = '') -> str:
  """``run_dmc.py --help``: ``usage``, then every run flag by group
  (``FLAG_GROUPS``) with its default and help."""
  lines = [usage.rstrip(), ''] if usage else []
  for title, names in FLAG_GROUPS:
    lines.append(f'{title}:')
    for name in names:
      flag = fv[name]
      default = flag.default
      shown = repr(default) if isinstance(default, str) else default
      lines.append(f'  --{name} (default {shown})')
      lines.append(flags.text_wrap(flag.help, indent='      ',
                                   firstline_indent='      '))
    lines.append('')
  lines.append('All flags, absl\'s included: --helpfull.')
  return '\n'.join(lines)


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the run flags (and their validators) on ``fv``, by group."""
  F = dict(flag_values=fv)
  _define_run_flags(F)
  _define_replay_flags(F)
  program_flags.define_program_flags(F)
  program_flags.define_remote_flags(F)
  _register_validators(fv)


def _define_run_flags(F: dict) -> None:
  """Task, budget, model, evaluation and log cadence."""
  flags.DEFINE_enum('suite', 'dmc', [s for s in suites.SUITES if s != 'custom'],
                    'Where --task comes from: dm_control, gym 0.26, '
                    'gymnasium 1.x, ale-py (Atari) or Crafter (task reward / '
                    'noreward) '
                    '(experiments/envs/suites.py).', **F)
  flags.DEFINE_string('task', 'walker_walk',
                      'dmc: task "domain_task" (spec 7.5 list in '
                      'experiments/envs/dmc.py); gym / gymnasium: a task id '
                      'like CartPole-v1; atari: a game like pong.', **F)
  flags.DEFINE_enum('size', 'size12m', sorted(SIZE_PRESETS),
                    'Model size preset (spec 2.1); paper protocol size12m.', **F)
  flags.DEFINE_float('train_ratio', 512.0,
                     'Replayed steps trained per agent step (spec 6.1); 512 = paper.', **F)
  flags.DEFINE_bool('image', False, 'dm_control: observe a 64x64 RGB image '
                    "('image', rendered with MuJoCo EGL; spec 2.10, the official "
                    'env.dmc.image).', **F)
  flags.DEFINE_bool('proprio', True, 'dm_control: observe its vector keys '
                    '(the official env.dmc.proprio; --image --noproprio is '
                    'DMC vision).', **F)
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
  flags.DEFINE_enum('eval_policy', 'sample', list(POLICY_MODES),
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


def _define_replay_flags(F: dict) -> None:
  """Replay, learner and device flags."""
  flags.DEFINE_integer('batch_size', 16, 'B (spec Table 4).', **F)
  flags.DEFINE_integer('batch_length', 64, 'T trained steps per row (spec 5.1).', **F)
  flags.DEFINE_integer('replay_capacity', 5_000_000, 'Replay items (spec 5.1).', **F)
  flags.DEFINE_integer('train_fill', 0,
                       'Items before training starts; 0 = B*T (spec 6.2).', **F)
  flags.DEFINE_float('time_limit', None,
                     'Episode length in simulated seconds (tests); default the '
                     "task's own (1000 control steps).", **F)
  flags.DEFINE_integer('chunk_length', None, 'Reverb chunk length of the '
                       'adder (unset: the WindowAdder default).', **F)
  flags.DEFINE_multi_string('config_overrides', [],
                            'Extra DreamerConfig fields as name=value '
                            '(e.g. lr=1e-4); see agent/config.py.', **F)
  flags.DEFINE_bool('learner_prefetch', True, 'The learner samples its next '
                    'batch during the current update (spec 6.3b); false keeps '
                    'the strict synchronous order.', **F)
  flags.DEFINE_bool('report', True, 'Write report.png (experiments/tools/report.py) '
                    'at the end.', **F)
  flags.DEFINE_string('jax_cache_dir', None,
                      'Persistent XLA compilation cache (a resumed run skips '
                      'recompiling), in every process of either layout; '
                      'default <logdir>/jax_cache, "off" disables.', **F)
  flags.DEFINE_integer('learner_devices', 1, 'Devices the update runs '
                       'data-parallel over (batch rows split, params '
                       'replicated; agent/parallel.py); --batch_size must be a '
                       'multiple. On a CPU, XLA_FLAGS=--xla_force_host_platform_'
                       'device_count=N makes N devices.', **F)
  flags.DEFINE_integer('policy_device', 0, 'Index of the device that serves '
                       'acting params (the official --jax.policy_devices).', **F)
  flags.DEFINE_integer('max_skipped_updates', 100, 'Consecutive skipped '
                       'updates (non-finite batch, loss or gradient) after '
                       'which the run stops with a message naming the last '
                       'good checkpoint (experiments/run/health.py); 0 = '
                       'never.', **F)
  flags.DEFINE_float('replay_value_limit', DEFAULT_VALUE_LIMIT,
                     'Largest |value| of a stored observation, and of a '
                     'reward or action without a declared range (dm_control '
                     'rewards: [0, 1] per control step; actions: the '
                     "policy's range); steps beyond it are refused, and "
                     'sampled items beyond it dropped '
                     '(reverb_tables/step_checks.py); inf: no limit.', **F)


def _register_validators(fv: flags.FlagValues) -> None:
  """Each flag's check: the range tables and the rules of their homes."""
  F = dict(flag_values=fv)

  def v(name, check, msg):
    flags.register_validator(name, check, message=f'--{name} {msg}', **F)

  flags.register_multi_flags_validator(
      ['suite', 'task', 'time_limit', 'image', 'proprio', 'action_repeat'],
      _task_ok, flag_values=fv,
      message='--suite / --task / --time_limit / --image / --action_repeat')
  # The range rules of the replay, the run and the program: one table each
  # (REPLAY_RULES, RUN_RULES, settings.RULES), checked again when the
  # configs are made.
  for rule in (list(REPLAY_RULES.values()) + list(RUN_RULES.values()) +
               list(RULES.values())):
    if rule[0] in fv:
      v(rule[0], functools.partial(rule_ok, rule), rule_text(rule))
  for rule in OPTIONAL_RUN_RULES.values():   # unset (None) is the default
    v(rule[0], lambda x, rule=rule: x is None or rule_ok(rule, x),
      rule_text(rule))
  v('max_skipped_updates', _max_skipped_ok, 'must be an integer >= 0 '
    '(0 = never stop)')
  v('coordinator_address', _address_ok, 'must be HOST:PORT (or empty)')
  v('join', lambda x: _address_ok(x) or os.path.exists(str(x)),
    'must be HOST:PORT or a run directory with a join.json (or empty)')
  v('learner_peer', lambda x: x is None or 1 <= x <= 63, 'must be in [1, 63]')
  flags.register_multi_flags_validator(
      ['logdir', 'join'], lambda d: bool(d['logdir'] or d['join']),
      message='--logdir is required (the run directory)', flag_values=fv)
  v('config_overrides', _overrides_ok,
    'entries must be name=value with a DreamerConfig field name (not one that '
    'has its own flag) and a value of that field\'s type')


def _address_ok(value) -> bool:
  """'' or HOST:PORT (``addresses.parse_address``)."""
  if not value:
    return True
  try:
    parse_address(value)
  except ValueError:
    return False
  return True


def _max_skipped_ok(value) -> bool:
  try:
    check_max_skipped(value)
  except ValueError:
    return False
  return True


def _task_ok(values) -> bool:
  """The suite's own check (``experiments.envs.suites.check_task``): an
  unknown task lists the valid ones; --time_limit is dm_control's."""
  try:
    suites.check_task(values['suite'], values['task'], values['time_limit'],
                      values['image'], values['proprio'],
                      values['action_repeat'])
  except ValueError as e:
    msg = str(e)
    if not msg.startswith('--'):          # the task itself: name the flag
      msg = f'--task is not a task of --suite={values["suite"]}: {msg}'
    raise flags.ValidationError(msg) from e
  return True


def _overrides_ok(entries) -> bool:
  try:
    parse_overrides(entries, FLAGGED_FIELDS)
  except ValueError as e:        # the message names the field and its type
    raise flags.ValidationError(str(e)) from e
  return True


# -- what the parsed flags make ----------------------------------------------
def configs_from_flags(fv: flags.FlagValues = flags.FLAGS
                       ) -> Tuple[RunConfig, DreamerConfig,
                                  Optional[DistributedConfig]]:
  """(RunConfig, DreamerConfig, DistributedConfig or None without
  --distributed) from parsed flags; ValueError names the flag."""
  kw = {name: fv[name].value for name in CONFIG_FLAGS}   # train_ratio, ...
  kw['train_fill'] = fv.train_fill or fv.batch_size * fv.batch_length
  kw.update(parse_overrides(fv.config_overrides, FLAGGED_FIELDS))
  try:
    config = make_config(**kw)
  except ValueError as e:
    raise ValueError(f'invalid configuration from flags: {e}') from e
  names = FLAG_NAMES + (program_flags.DIST_FLAG_NAMES if fv.distributed
                        else ())
  text = ''.join(fv[name].serialize() + '\n' for name in names
                 if fv[name].serialize())
  logdir = os.path.abspath(os.path.expanduser(fv.logdir))
  run = RunConfig(
      suite=fv.suite, task=fv.task, logdir=logdir,
      env_steps=fv.env_steps, num_envs=fv.num_envs,
      action_repeat=fv.action_repeat, eval_every=fv.eval_every,
      eval_episodes=fv.eval_episodes, eval_policy=fv.eval_policy,
      checkpoint_every=fv.checkpoint_every, log_every=fv.log_every,
      learner_log_every=fv.learner_log_every,
      progress_every=fv.progress_every, time_limit=fv.time_limit,
      image=fv.image, proprio=fv.proprio,
      chunk_length=fv.chunk_length or None, prefetch=fv.learner_prefetch,
      report=fv.report, jax_cache_dir=jax_cache_dir(fv, logdir),
      learner_devices=fv.learner_devices, policy_device=fv.policy_device,
      max_skipped_updates=fv.max_skipped_updates,
      replay_value_limit=fv.replay_value_limit, flags_text=text)
  dist = None
  if fv.distributed:
    dist = DistributedConfig(
        num_actors=fv.num_actors, update_period=fv.actor_update_period,
        terminal=fv.lp_terminal, stop_grace_s=fv.stop_grace,
        max_restarts=fv.max_restarts,
        learner_processes=fv.learner_processes,
        coordinator_address=fv.coordinator_address,
        remote_learner_processes=fv.remote_learner_processes,
        join_slots=fv.join_slots, join_port=fv.join_port, bind=fv.bind,
        join_lease_s=fv.join_lease, join_max_envs=fv.join_max_envs,
        join_secret_file=(os.path.abspath(os.path.expanduser(
            fv.join_secret_file)) if fv.join_secret_file else ''),
        isolation=fv.isolation)
  elif fv.learner_processes != 1:
    raise ValueError('--learner_processes needs --distributed (the learner '
                     'processes are nodes of the Launchpad program)')
  elif (fv.join_slots or fv.join_port or fv.bind or fv.join_max_envs or
        fv.join_secret_file or fv.remote_learner_processes):
    raise ValueError('--join_slots, --join_port, --bind, --join_max_envs, '
                     '--join_secret_file and --remote_learner_processes need '
                     '--distributed (they are settings of the Launchpad '
                     'program)')
  return run, config, dist


def experiment_from_flags(fv: flags.FlagValues = flags.FLAGS
                          ) -> Tuple[DreamerExperiment,
                                     Optional[DistributedConfig]]:
  """(the experiment, the Launchpad program's settings or None without
  --distributed) from parsed flags: what both layouts take; ValueError
  names the flag."""
  run, config, dist = configs_from_flags(fv)
  return make_experiment(run, config, join_workers(dist)), dist


def join_workers(dist: Optional[DistributedConfig]) -> int:
  """Env workers the builder reserves for remote actors (``--join_slots``)."""
  return dist.join_slots if dist is not None else 0


def jax_cache_dir(fv: flags.FlagValues, logdir: str) -> Optional[str]:
  """--jax_cache_dir: default <logdir>/jax_cache; 'off' -> None."""
  value = fv.jax_cache_dir
  if value == 'off':
    return None
  return os.path.abspath(os.path.expanduser(value or os.path.join(logdir,
                                                                  'jax_cache')))
