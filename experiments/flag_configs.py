"""What parsed run flags make: the configs, the experiment, and the
arguments of a remote actor or learner process.

``configs_from_flags(fv)`` turns flags defined by
``experiments.options.define_flags`` into (RunConfig, DreamerConfig,
DistributedConfig or None); ``experiment_from_flags(fv)`` into the
experiment both layouts take (``experiments.run.experiment``) and the
Launchpad program's settings; ``join_args_from_flags`` /
``peer_args_from_flags`` into what ``--join`` / ``--learner_peer`` run. Each
raises ValueError that names the flag; the rules themselves live where
``experiments.options`` says.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

from absl import flags

from agent.config import DreamerConfig, make_config
from experiments.config_overrides import CONFIG_FLAGS, parse_overrides
from experiments.layouts.distributed.settings import DistributedConfig
from experiments.options import (
    DIST_FLAG_NAMES, FLAG_NAMES, JOIN_FLAG_NAMES, PEER_FLAG_NAMES)
from experiments.run.config import RunConfig
from experiments.run.experiment import DreamerExperiment, make_experiment

def jax_cache_dir(fv: flags.FlagValues, logdir: str) -> Optional[str]:
  """--jax_cache_dir: default <logdir>/jax_cache; 'off' -> None."""
  value = fv.jax_cache_dir
  if value == 'off':
    return None
  return os.path.abspath(os.path.expanduser(value or os.path.join(logdir,
                                                                  'jax_cache')))


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
          '--distributed --learner_peer=K --logdir=DIR [--bind=HOST] '
          '[--join_secret_file=F]')
  elif not fv.distributed:
    raise ValueError('$JAX_PROCESS_ID >= 1 runs a remote learner process, '
                     'which needs --distributed')
  if not fv.logdir:
    raise ValueError('--learner_peer needs --logdir: the program\'s run '
                     'directory, shared at the same path')
  return (os.path.abspath(os.path.expanduser(fv.logdir)), fv.learner_peer,
          fv.bind, fv.join_secret_file)


def join_workers(dist: Optional[DistributedConfig]) -> int:
  """Env workers the builder reserves for remote actors (``--join_slots``)."""
  return dist.join_slots if dist is not None else 0


def experiment_from_flags(fv: flags.FlagValues = flags.FLAGS
                          ) -> Tuple[DreamerExperiment,
                                     Optional[DistributedConfig]]:
  """(the experiment, the Launchpad program's settings or None without
  --distributed) from parsed flags: what both layouts take
  (``experiments.run.experiment``); ValueError names the flag."""
  run, config, dist = configs_from_flags(fv)
  return make_experiment(run, config, join_workers(dist)), dist


def configs_from_flags(fv: flags.FlagValues = flags.FLAGS
                       ) -> Tuple[RunConfig, DreamerConfig,
                                  Optional[DistributedConfig]]:
  """(RunConfig, DreamerConfig, DistributedConfig or None without
  --distributed) from parsed flags; ValueError names the flag."""
  kw = {name: fv[name].value for name in CONFIG_FLAGS}
  kw['train_fill'] = fv.train_fill or fv.batch_size * fv.batch_length
  kw.update(parse_overrides(fv.config_overrides))
  try:
    config = make_config(**kw)
  except ValueError as e:
    raise ValueError(f'invalid configuration from flags: {e}') from e
  names = FLAG_NAMES + (DIST_FLAG_NAMES if fv.distributed else ())
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
      image=fv.image, proprio=fv.proprio, chunk_length=fv.chunk_length or None, prefetch=fv.learner_prefetch,
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
