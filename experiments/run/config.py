"""A run's loop settings and seeds, shared by both layouts (spec 6.5, 7.5).

``RunConfig`` holds what a run does besides the agent (the DreamerConfig):
task, budget, envs, evaluation, logging and checkpoint cadence. Seeds: a
run's ``--seed`` seeds the params, the policy and the envs; segment r (the
r-th start of a resumed run) steps envs seeded from
``segment_seed(seed, r)`` and evaluates in envs seeded from
``segment_seed(seed, r, evaluation=True)``; env i of a VectorEnv then gets
``experiments.envs.vector.worker_seed(base, i)`` = base * 1000 + i.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable, Dict, Optional, Tuple

from agent.actor import POLICY_MODES
from experiments.envs import suites
from experiments.envs.vector import VectorEnv
from reverb_tables.config import Rule, check_rules
from reverb_tables.step_checks import DEFAULT_VALUE_LIMIT

# Segment r of a run seeds its training envs from seed + SEGMENT_SEED_STRIDE*r;
# its eval envs add EVAL_SEED_OFFSET; the k-th in-place restart of a
# Launchpad actor or evaluator node adds RESTART_SEED_STRIDE*k.
SEGMENT_SEED_STRIDE = 7919
EVAL_SEED_OFFSET = 1_000_003
RESTART_SEED_STRIDE = 104_729


def segment_seed(seed: int, segment: int, evaluation: bool = False,
                 restart: int = 0) -> int:
  """Base seed of segment ``segment``'s training (or eval) envs; ``restart``
  > 0 for a node restarted in place (its envs never repeat a stream)."""
  return (int(seed) + SEGMENT_SEED_STRIDE * int(segment) +
          RESTART_SEED_STRIDE * int(restart) +
          (EVAL_SEED_OFFSET if evaluation else 0))


def log(msg: str) -> None:
  """A line on stderr (every run message of both layouts)."""
  print(msg, file=sys.stderr, flush=True)


def next_multiple(x: int, every: int) -> int:
  """The first multiple of ``every`` above ``x``: the next log or eval point
  of a grid of ``every`` env steps (the one grid rule of both layouts)."""
  return (int(x) // int(every) + 1) * int(every)


# field: rule -- the one home of the RunConfig's range rules (flags:
# experiments.options registers the same table as absl validators).
RUN_RULES: Dict[str, Rule] = {
    'env_steps': ('env_steps', 0, None, True),
    'eval_episodes': ('eval_episodes', 0, 1000, False),
    'checkpoint_every': ('checkpoint_every', 0, None, True),
    'log_every': ('log_every', 0, None, True),
    'learner_log_every': ('learner_log_every', 0, None, False),
    'progress_every': ('progress_every', 0, None, True),
    'num_envs': ('num_envs', 1, 1000, False),
    'action_repeat': ('action_repeat', 1, None, False),
    'eval_every': ('eval_every', 0, None, False),
    'learner_devices': ('learner_devices', 1, None, False),
    'policy_device': ('policy_device', 0, None, False),
    'replay_value_limit': ('replay_value_limit', 0, None, True),
}

# Fields that may be None (the default: dm_control's own episode length, the
# WindowAdder's chunk length); when set, their range rule holds.
OPTIONAL_RUN_RULES: Dict[str, Rule] = {
    'time_limit': ('time_limit', 0, None, True),
    'chunk_length': ('chunk_length', 1, None, False),
}


def check_max_skipped(value) -> int:
  """``--max_skipped_updates`` (``experiments.run.health``) as an int;
  ValueError naming the flag unless it is an integer >= 0 (0 = never stop)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError('--max_skipped_updates must be an integer >= 0 '
                     '(consecutive skipped updates before the run stops; '
                     f'0 = never), got {value!r}')
  return value


@dataclasses.dataclass
class RunConfig:
  """Loop settings of either layout (the DreamerConfig holds the agent's).

  checkpoint_every is in seconds of wall time (a restart loses at most that
  much work); eval_every and log_every are in env steps (agent steps x
  action_repeat, the spec 7.5 x-axis); progress_every in seconds.
  prefetch: the learner samples its next batch during the current update
  (spec 6.3b, docs/deviations.md "Training loop"); False keeps the strict
  synchronous order (sample after the previous write-back).
  jax_cache_dir: JAX's persistent compilation cache, used by every process
  of the run that compiles (``enable_compilation_cache``); None: off.
  report: the entry point writes report.png at the end.
  learner_devices / policy_device: the learner's update runs data-parallel
  over the first ``learner_devices`` devices; acting params are served from
  device ``policy_device`` (``agent.parallel``). Not resume-fixed: a run
  checkpointed with N devices resumes with M.
  max_skipped_updates: consecutive skipped (non-finite) updates after which
  the run stops (``experiments.run.health.SkipGuard``); 0 never.
  replay_value_limit: the largest |value| of a stored observation, and of
  a reward or action without a declared range; the replay refuses (adders)
  and drops (the learner's sampler) steps beyond it
  (``reverb_tables.step_checks``). Not resume-fixed.
  """
  task: str
  logdir: str
  env_steps: int
  suite: str = 'dmc'                      # experiments.envs.suites: dmc, gym, custom
  num_envs: int = 16
  action_repeat: int = 2
  eval_every: int = 0
  eval_episodes: int = 0
  eval_policy: str = 'sample'
  checkpoint_every: float = 600.0
  log_every: int = 10_000
  learner_log_every: int = 0              # updates; 0 = no 'learner' rows
  progress_every: float = 10.0
  time_limit: Optional[float] = None
  image: bool = False                     # dm_control: render 64x64 'image' (2.10)
  proprio: bool = True                    # dm_control: its vector keys
  chunk_length: Optional[int] = None      # None: the WindowAdder default
  prefetch: bool = True
  report: bool = True
  jax_cache_dir: Optional[str] = None     # XLA compilation cache; None = off
  learner_devices: int = 1                # data-parallel update (agent.parallel)
  policy_device: int = 0                  # device serving acting params
  max_skipped_updates: int = 100          # experiments.run.health; 0 = never stop
  replay_value_limit: float = DEFAULT_VALUE_LIMIT   # reverb_tables.step_checks
  flags_text: str = ''
  verbose: bool = True
  # suite 'custom': seed -> dm_env.Environment (not saved; give it again to
  # resume, README "Your own environment").
  env_factory: Optional[Callable] = dataclasses.field(default=None, repr=False,
                                                      compare=False)

  def __post_init__(self):
    check_rules(RUN_RULES, self)
    check_rules({f: r for f, r in OPTIONAL_RUN_RULES.items()
                 if getattr(self, f) is not None}, self)
    if self.suite == 'custom' and self.env_factory is None:
      raise ValueError("suite 'custom' needs env_factory (seed -> dm_env.Environment)")
    suites.check_task(self.suite, self.task, self.time_limit, self.image,
                      self.proprio, self.action_repeat)
    check_max_skipped(self.max_skipped_updates)
    if self.eval_policy not in POLICY_MODES:
      raise ValueError(f'--eval_policy must be one of {POLICY_MODES}, got '
                       f'{self.eval_policy!r}')

  def make_env(self, num_envs: int, base_seed: int,
               first_index: int = 0) -> VectorEnv:
    """``VectorEnv`` over ``num_envs`` envs of this run's task; env i is
    seeded ``worker_seed(base_seed, first_index + i)``."""
    return VectorEnv(self.task, num_envs, self.action_repeat, seed=base_seed,
                     time_limit=self.time_limit, first_index=first_index,
                     suite=self.suite, env_factory=self.env_factory,
                     image=self.image, proprio=self.proprio)


def enable_compilation_cache(path: str) -> None:
  """Persistent XLA compilation cache at ``path`` (JAX's own, keyed by jax
  version, backend and flags): a resumed or repeated run skips recompiling
  the update (~40 s for size1m on 2 CPU cores; ~7 s with the cache)."""
  import jax
  os.makedirs(path, exist_ok=True)
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 1.0)
