"""The run state of a checkpoint (``run_state.json``): one schema for both
layouts (``make_run_state``); older checkpoints are upgraded on reading
(``load_run_state``). Part of the run directory (``rundir``)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional

RUN_STATE_FILE = 'run_state.json'
MODES = ('single_process', 'distributed')

RUN_STATE_SCHEMA = 2
# What every layout's learner saves; the one-process layout adds its train
# schedule's position (``ScheduledUpdates``), the Launchpad one
# its join service's claim numbers: each writes only what it has.
LEARNER_KEYS = ('updates', 'online_rows', 'uniform_rows', 'wall_time',
                'next_log')
ONE_PROCESS_LEARNER_KEYS = ('transitions', 'owed_updates')
ACTOR_KEYS = ('offset', 'num_envs', 'num_items', 'num_online_items',
              'num_policy_calls')


def make_run_state(*, mode: str, segment: int, counts: Mapping[str, Any],
                   counter: Mapping[str, Any], learner: Mapping[str, Any],
                   actors, evaluator: Optional[Mapping[str, Any]],
                   recent_scores) -> Dict[str, Any]:
  """``run_state.json`` of a checkpoint, the same schema in both layouts.

  counts: the run's counts at the checkpoint ('actor_steps', 'env_steps' (the
  x-axis of every row), 'episodes', 'learner_steps'); counter: the root
  ``acme.utils.counting.Counter``'s ``save()`` (restored on resume); learner: ``LEARNER_KEYS`` (update count, sampler rows, wall
  time, next log step, and for the one-process schedule the transitions it
  has seen and the updates it owes); actors: one dict per actor process (one
  in a single-process run) with ``ACTOR_KEYS`` (its slice of env workers, its
  adder's item counts, its policy-rng position) and whatever else it saves;
  evaluator: ``Evaluator.get_state()``; recent_scores: the last training
  episode scores (progress line). ``write_checkpoint`` adds 'files' and
  'time'."""
  assert mode in MODES, mode
  missing = [k for k in LEARNER_KEYS + (ONE_PROCESS_LEARNER_KEYS if mode ==
                                        'single_process' else ())
             if k not in learner]
  missing += [f'actors[{i}].{k}' for i, a in enumerate(actors)
              for k in ACTOR_KEYS if k not in a]
  assert not missing, missing
  return {'schema': RUN_STATE_SCHEMA, 'mode': mode, 'segment': int(segment),
          'counts': dict(counts), 'counter': dict(counter),
          'learner': dict(learner), 'actors': [dict(a) for a in actors],
          'evaluator': dict(evaluator) if evaluator else None,
          'recent_scores': [float(x) for x in recent_scores][-5:]}


def _upgrade_schema_1(state: Dict[str, Any]) -> Dict[str, Any]:
  """A run state written before schema 2 (no 'schema' key) in schema 2.

  The single-process layout kept its counters under 'counters', the train
  schedule's position under 'agent' and the policy rng under 'actor'; the
  distributed one already had 'learner' and 'actors'."""
  state = dict(state)
  if 'counters' in state:                           # single-process, schema 1
    c, agent_state = state.pop('counters'), state.pop('agent')
    state['learner'] = {
        'updates': c['updates'], 'online_rows': c['online_rows'],
        'uniform_rows': c['uniform_rows'], 'wall_time': c['wall_time'],
        'next_log': None, 'transitions': agent_state['num_transitions'],
        'owed_updates': agent_state.get('owed_updates', 0)}
    state['recent_scores'] = c['recent_scores']
    state['counts'] = {'actor_steps': c['agent_steps'],
                       'env_steps': c['env_steps'], 'episodes': c['episodes'],
                       'learner_steps': c['updates']}
    state['actors'] = [{'offset': 0, 'num_envs': None, 'num_items': None,
                        'num_online_items': None,
                        **state.pop('actor')}]
  else:                                             # distributed, schema 1
    state['learner'] = dict(state['learner'])
    state.setdefault('recent_scores', [])
  state['schema'] = RUN_STATE_SCHEMA
  return state


def load_run_state(ckpt: str) -> Dict[str, Any]:
  """The checkpoint's run state in the current schema (older checkpoints are
  upgraded); ValueError naming the checkpoint when it cannot be read."""
  path = os.path.join(ckpt, RUN_STATE_FILE)
  try:
    with open(path) as f:
      state = json.load(f)
    if state.get('schema', 1) == 1:
      state = _upgrade_schema_1(state)
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(
        f'checkpoint {ckpt}: cannot read its run state {path} ({e!r}); it was '
        'written by another version of the run layer or is damaged. Resume '
        'it with that version or use a new --logdir.') from e
  if state['schema'] != RUN_STATE_SCHEMA:
    raise ValueError(
        f'checkpoint {ckpt} has run-state schema {state["schema"]}; this '
        f'version reads schema {RUN_STATE_SCHEMA} (and upgrades 1). Resume it '
        'with the version that wrote it or use a new --logdir.')
  state.setdefault('mode', 'single_process')
  return state
