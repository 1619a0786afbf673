"""Acme actor, learner and builder (spec 5.3, 5.7-5.9, 6.1, 7.1, 7.2, 7.4).

Real Reverb servers and real dm_control envs, no mocks; the tiny model preset.
The jitted update is built once per module and shared by the learners
(``train_step=``), so the module compiles it once.
"""

import agent  # noqa: F401  (jax compat before acme)

import jax
import numpy as np
import pytest

from agent import acting, learning
from agent.actor import DreamerActor, NonFiniteActionError, StaticVariableClient
from agent.builder import DreamerBuilder, seed_keys
from agent.config import make_config
from agent.learner import DreamerLearner
from experiments.envs.vector import VectorEnv
from reverb_tables.tables import for_one_process, make_server
from tests.smoke_model import SMOKE_MODEL

TASK = 'cartpole_swingup'


@pytest.fixture(scope='module')
def config():
  # The shared model (tests/smoke_model.py): one update compile per session.
  return make_config(**SMOKE_MODEL, replay_capacity=10_000, train_fill=16,
                     train_ratio=16)


@pytest.fixture(scope='module')
def envs():
  env = VectorEnv(TASK, num_envs=2, action_repeat=2, seed=0, time_limit=0.3)
  yield env
  env.close()


@pytest.fixture(scope='module')
def parts(config, envs):
  """Builder, networks, policy and one shared jitted TrainStep."""
  builder = DreamerBuilder(config, envs.spaces, num_envs=2)
  nets = builder.make_networks()
  train_step = learning.make_train_step(nets)
  return builder, nets, train_step


class Replay:
  """Server + adder + dataset from the builder (one per test)."""

  def __init__(self, builder):
    self.server = make_server(for_one_process(
        builder.make_replay_tables(), num_workers=builder.num_envs,
        chunk_length=builder.chunk_length))
    self.client = self.server.localhost_client()
    self.adder = builder.make_adder(self.client)
    self.dataset = builder.make_dataset_iterator(self.client)

  def close(self):
    self.adder.close()       # open writers make server.stop() wait ~5 s
    self.server.stop()


@pytest.fixture
def replay(parts):
  r = Replay(parts[0])
  yield r
  r.close()


def _params(nets, seed=0):
  return acting.acting_params(nets.init(jax.random.PRNGKey(seed)))


def _fake_obs(spaces, n, rng, is_first, is_last=None):
  obs = {k: rng.normal(size=(n,) + tuple(s)).astype(np.float32)
         for k, s in spaces.obs.items()}
  obs['reward'] = rng.uniform(size=n).astype(np.float32)
  obs['is_first'] = np.asarray(is_first, bool)
  obs['is_last'] = np.zeros(n, bool) if is_last is None else np.asarray(is_last, bool)
  obs['is_terminal'] = np.zeros(n, bool)
  return obs


def test_actor_carry_reset_by_is_first(parts, envs):
  """spec 2.2 / 7.1: an env whose obs is_first acts as from a zero carry."""
  builder, nets, _ = parts
  policy = acting.make_policy(nets)
  params = StaticVariableClient(_params(nets))
  key = seed_keys(0)['actor']
  a = DreamerActor(policy, envs.spaces, 2, key, params)
  b = DreamerActor(policy, envs.spaces, 2, key, params)
  rng = np.random.default_rng(0)
  # Different histories for the two actors (same policy-call counts).
  for t in range(3):
    a.select_action(_fake_obs(envs.spaces, 2, rng, [t == 0] * 2))
    b.select_action(_fake_obs(envs.spaces, 2, rng, [t == 0] * 2))
  obs = _fake_obs(envs.spaces, 2, rng, [True, False])
  act_a = a.select_action(obs)
  act_b = b.select_action(obs)
  # env 0 restarted: identical outputs; env 1 kept its (different) history.
  np.testing.assert_array_equal(act_a[0], act_b[0])
  np.testing.assert_array_equal(np.asarray(a._carry.deter)[0],
                                np.asarray(b._carry.deter)[0])
  assert not np.array_equal(act_a[1], act_b[1])
  # One compilation for every call (spec 7.1: one jitted call per vector step).
  assert a._fn._cache_size() == 1


def test_actor_stores_unclipped_action_zeroed_at_is_last(parts, envs, replay,
                                                         config):
  """spec 7.2 / 7.4: replay gets the raw sample, 0 at is_last; env gets raw."""
  builder, nets, _ = parts
  actor = DreamerActor(acting.make_policy(nets), envs.spaces, 2,
                       seed_keys(1)['actor'], StaticVariableClient(_params(nets)),
                       replay.adder)
  obs = envs.reset().observation
  returned = []
  flags = []
  for _ in range(2 * config.seq_len + 5):
    action = actor.select_action(obs)
    returned.append(action.copy())
    flags.append(obs['is_last'].copy())
    nxt = envs.step(action, reset=obs['is_last']).observation
    actor.observe(action, nxt)
    obs = nxt
  replay.adder.flush()
  returned = np.stack(returned, 1)         # [N, steps, A]
  flags = np.stack(flags, 1)               # [N, steps]
  assert flags.any(), 'time_limit should end episodes inside the test'
  assert (np.abs(returned) > 1).any(), 'expected some unclipped samples'
  seen = 0
  for _ in range(40):
    batch = replay.dataset.sampler.sample_report(4)
    for row in range(4):
      w = batch['step_id'][row, :, 0]
      idx = batch['step_id'][row, :, 1]
      want = returned[w, idx]
      want = np.where(flags[w, idx][:, None], 0.0, want)
      np.testing.assert_array_equal(batch['action'][row], want)
      # is_last flags reach the replay (annotation may add more, spec 5.3).
      assert (batch['is_last'][row] >= flags[w, idx]).all()
      seen += 1
  assert seen and (np.abs(returned[~flags]) > 1).any()


def test_actor_non_finite_actions_raise_before_env_and_replay(parts, envs,
                                                              replay):
  """Bad input: NaN params -> NonFiniteActionError; the replay is untouched."""
  builder, nets, _ = parts
  params = _params(nets)
  params = {k: ({n: np.full_like(v, np.nan) for n, v in leaves.items()}
                if k.startswith('pol') else leaves) for k, leaves in params.items()}
  actor = DreamerActor(acting.make_policy(nets), envs.spaces, 2,
                       seed_keys(0)['actor'], StaticVariableClient(params),
                       replay.adder)
  obs = envs.reset().observation
  with pytest.raises(NonFiniteActionError, match='non-finite'):
    actor.select_action(obs)
  assert replay.adder.lengths.tolist() == [0, 0]
  with pytest.raises(RuntimeError):
    actor.observe(None, obs)


def _fill(builder, nets, replay, envs, steps, learner=None):
  """Acts with the learner's params (or init params) for ``steps`` vector steps."""
  source = learner if learner is not None else None
  if source is None:
    actor = DreamerActor(acting.make_policy(nets), envs.spaces, 2,
                         seed_keys(0)['actor'],
                         StaticVariableClient(_params(nets)), replay.adder)
  else:
    actor = builder.make_actor(seed_keys(0)['actor'], builder.make_policy(nets),
                               replay.adder, source)
  obs = envs.reset().observation
  for _ in range(steps):
    actor.update(wait=True)
    action = actor.select_action(obs)
    nxt = envs.step(action, reset=obs['is_last']).observation
    actor.observe(action, nxt)
    obs = nxt
  replay.adder.flush()
  return actor


def test_learner_write_back_compile_once_variables_and_restore(parts, envs,
                                                               replay, config):
  """spec 5.9: posteriors of indices 1..T are written back under step_id[:, 1:];
  the update compiles once; variables survive donation; save/restore."""
  builder, nets, train_step = parts
  captured = []

  def write_back(step_ids, outs):
    captured.append((np.array(step_ids), {k: np.array(v) for k, v in outs.items()}))
    return replay.dataset.write_back(step_ids, outs)

  batches = []

  class Capture:
    def __next__(self):
      batches.append(next(replay.dataset))
      return batches[-1]

  learner = DreamerLearner(nets, Capture(), seed_keys(0)['learner'],
                           write_back=write_back, train_step=train_step)
  _fill(builder, nets, replay, envs, config.seq_len + 4)
  policy_vars = learner.get_variables(['policy'])[0]
  assert {k.split('/')[0] for k in policy_vars} == {'enc', 'dyn', 'pol'}
  metrics = learner.step()
  assert np.isfinite(metrics['loss/total']) and metrics['skipped_update'] == 0
  # write-back: ids are the batch's step_id[:, 1:], values are in the store.
  ids, outs = captured[-1]
  np.testing.assert_array_equal(ids, batches[-1]['step_id'][:, 1:])
  assert outs['deter'].shape[:2] == (config.batch_size, config.batch_length)
  fresh, found = replay.dataset.latent_store.lookup(ids)
  assert found.all()
  np.testing.assert_array_equal(fresh['stoch'], outs['stoch'])
  np.testing.assert_array_equal(fresh['deter'], outs['deter'])
  # Old variables stay readable after later (donating) updates.
  learner.step()
  _ = jax.tree_util.tree_map(np.asarray, policy_vars)
  saved = learner.save()
  learner.step()
  learner.restore(saved)
  restored = learner.save()
  for a, b in zip(jax.tree_util.tree_leaves(saved), jax.tree_util.tree_leaves(restored)):
    np.testing.assert_array_equal(a, b)
  learner.step()
  assert learner.update_cache_size() == 1
  with pytest.raises(ValueError, match='unknown variable'):
    learner.get_variables(['nope'])


def test_learner_rows_are_window_means_keyed_by_global_updates(parts, envs,
                                                              replay, config):
  """--learner_log_every: every N-th update (the counter's global
  learner_steps, so a resumed run keeps its windows) the logger gets the means
  of the metrics over the updates since its last row (bench/parity.py)."""
  from acme.utils import counting
  builder, nets, train_step = parts
  rows = []

  class Rows:
    def write(self, data):
      rows.append(dict(data))

  counter = counting.Counter(time_delta=0.0)
  counter.increment(learner_steps=1)           # as after a resume at 1 update
  learner = DreamerLearner(nets, replay.dataset, seed_keys(0)['learner'],
                           train_step=train_step, counter=counter,
                           logger=Rows(), log_every=2)
  _fill(builder, nets, replay, envs, config.seq_len + 4)
  got = [learner.step() for _ in range(3)]     # global updates 2, 3, 4
  assert [r['learner_steps'] for r in rows] == [2, 4]
  assert [r['updates_in_mean'] for r in rows] == [1.0, 2.0]
  for name in ('loss/total', 'loss/dyn', 'grad_norm'):
    assert rows[0][name] == pytest.approx(got[0][name])
    assert rows[1][name] == pytest.approx((got[1][name] + got[2][name]) / 2)


def test_builder_actor_learner_loop_follows_schedule(parts, envs, replay, config):
  """spec 6.1 / 6.2 via the builder: per-transition schedule; first update once
  the replay holds train_fill items; acting params follow the learner."""
  from experiments.layouts.scheduled import TrainSchedule
  builder, nets, train_step = parts
  learner = DreamerLearner(nets, replay.dataset, seed_keys(0)['learner'],
                           train_step=train_step)
  schedule = TrainSchedule(config)
  log = []
  step = [0]

  def on_add(worker):
    step[0] += 1
    n = schedule(step[0], replay.adder.num_items)
    for _ in range(n):
      learner.step()
    log.append((step[0], replay.adder.num_items, n))

  actor = builder.make_actor(seed_keys(0)['actor'], builder.make_policy(nets),
                             replay.adder, learner, on_add=on_add)
  obs = envs.reset().observation
  actor.update(wait=True)
  before = jax.tree_util.tree_map(np.asarray, actor._client.params)
  for _ in range(config.seq_len + 12):
    action = actor.select_action(obs)
    nxt = envs.step(action, reset=obs['is_last']).observation
    actor.observe(action, nxt)
    actor.update(wait=True)
    obs = nxt
  first = next(i for i, (_, items, n) in enumerate(log) if n)
  assert log[first][1] >= config.train_fill and log[first - 1][1] < config.train_fill
  assert log[first][2] == 1
  assert learner.num_steps == schedule.num_updates == sum(n for *_, n in log)
  after = jax.tree_util.tree_leaves(actor._client.params)
  changed = [1 for a, b in zip(jax.tree_util.tree_leaves(before), after)
             if not np.array_equal(a, np.asarray(b))]
  assert changed, 'actor should act with updated params'
  assert learner.update_cache_size() == 1


def test_eval_policy_mode_is_deterministic_action(parts, envs):
  """--eval_policy=mode (spec 7.3 option): the builder's eval policy takes the
  distribution's mode, tanh(mean) of the policy head on the step's features
  (computed here by tests/reference_losses.py, not the project's head); the
  same inputs give the same action. Training always samples: its actions are
  not tanh(mean) and leave [-1, 1]. A discrete policy's mode is the argmax."""
  from tests import reference_losses as ref
  builder, nets, _ = parts
  mode_builder = DreamerBuilder(builder.config, envs.spaces, num_envs=2,
                                eval_policy='mode')
  assert mode_builder.make_policy(nets)[1] == 'sample'
  assert mode_builder.make_policy(nets, evaluation=True)[1] == 'mode'
  assert builder.make_policy(nets, evaluation=True)[1] == 'sample'
  raw = _params(nets)
  params = StaticVariableClient(raw)
  acts, gaps, seen = {}, {}, []
  for mode in ('sample', 'mode', 'mode_again'):
    policy, m = (mode_builder.make_policy(nets, evaluation=True) if mode != 'sample'
                 else builder.make_policy(nets))
    actor = DreamerActor(policy, envs.spaces, 2, seed_keys(3)['eval'], params,
                         mode=m)
    obs = envs.reset().observation
    out, gap = [], []
    for t in range(40):
      if mode == 'mode_again':          # the same observations again
        obs = seen[t]
      out.append(actor.select_action(obs))
      carry = actor._carry
      feat = np.concatenate([np.asarray(carry.deter), np.asarray(carry.stoch)], -1)
      _, mean, _ = ref.policy(raw, feat, discrete=False)
      gap.append(np.abs(out[-1] - np.asarray(mean)).max())
      if mode == 'mode':
        seen.append(obs)
      obs = envs.step(out[-1], reset=obs['is_last']).observation
    acts[mode], gaps[mode] = np.stack(out), max(gap)
  assert gaps['mode'] < 1e-5, gaps
  np.testing.assert_array_equal(acts['mode'], acts['mode_again'])
  assert gaps['sample'] > 0.1, gaps
  assert (np.abs(acts['sample']) > 1).any()
  assert (np.abs(acts['mode']) <= 1).all()
  # Discrete: the mode is the one-hot argmax of the (unimixed) logits.
  from agent import networks, synthetic
  dspaces = synthetic.EnvSpaces(obs=dict(envs.spaces.obs), act_dim=3, discrete=True)
  dnets = networks.make_networks(dspaces, builder.config)
  dparams = acting.acting_params(dnets.init(jax.random.PRNGKey(1)))
  dpolicy = acting.make_policy(dnets)
  carry = dpolicy.initial_carry(2)
  obs = envs.reset().observation
  step = jax.jit(dpolicy.step, static_argnames='mode')
  for i in range(5):
    obs_v = {k: obs[k] for k in dspaces.obs}
    first = np.asarray(obs['is_first'])
    carry, action, _ = step(dparams, carry, obs_v, first, jax.random.PRNGKey(i),
                            mode='mode')
    feat = np.concatenate([np.asarray(carry.deter), np.asarray(carry.stoch)], -1)
    _, logp = ref.policy(dparams, feat, discrete=True)
    want = np.eye(3)[np.argmax(np.asarray(logp), -1)]
    np.testing.assert_array_equal(np.asarray(action), want)
    obs = envs.step(np.ones((2, 1)) * 0.1, reset=obs['is_last']).observation
  with pytest.raises(ValueError, match='policy mode'):
    DreamerActor(acting.make_policy(nets), envs.spaces, 2, seed_keys(0)['eval'],
                 params, mode='greedy')
