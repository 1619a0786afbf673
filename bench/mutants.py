"""Mutation score of the default suite: does a wrong learner fail?

A curated list of one-line defects of agent/ and reverb_tables/, the ones a
DreamerV3 port really ships (a swapped stop-gradient, a loss scale, free nats,
a mask, the replay context, the lambda-return index, the return normaliser,
the slow critic, unimix, the optimizer's order, the warm-up, the replay
ratio's schedule, the two-hot bins, ...). Each mutant is applied, one at a
time, to a scratch copy of the repository; the default suite's tests that
cover the mutated code then run there (``pytest -x -m "not slow"``), and the
first failing test is recorded. A mutant no test fails "survives".

    python bench/mutants.py                       # every mutant, this tree's tests
    python bench/mutants.py --tests_rev=82d01f1   # the same code, older tests
    python bench/mutants.py --only=free_nats_half,slow_rate

The scratch copy holds the files git tracks plus untracked, not-ignored ones
(the working tree as it is, not HEAD), with ``tests/`` optionally replaced by
the tests of another commit (``--tests_rev``), so the score before and after
a change to the tests is measured on the same code. Every run first checks
that the unmutated copy passes the same tests. All runs share one JAX
compilation cache (``DREAMER_TEST_JAX_CACHE``, tests/conftest.py), so a
program a mutant does not change is compiled once.

Writes ``bench/results/mutants_<label>.json`` and ``.md``: per mutant, the
file and line, the change, caught or not, the first failing test and the
seconds the run took (with the load average, as timings on a shared 2-core
machine are inflated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The default suite's tests that exercise the learner's maths, cheapest
# and most discriminating first (pytest -x stops at the first failure).
LEARNER = ['tests/test_spec_config.py', 'tests/test_distributions.py',
           'tests/test_actor_critic.py', 'tests/test_optimizer.py',
           'tests/test_blocks.py', 'tests/test_rssm.py', 'tests/test_learning.py']
# ... and the replay / schedule / acting side.
# ... and the image encoder / decoder (the official goldens, the literal loss).
CNN = ['tests/test_cnn.py', 'tests/test_spec_config.py']
REPLAY = ['tests/test_spec_config.py', 'tests/test_replay_ratio.py',
          'tests/test_replay_buffer.py', 'tests/test_env_loop.py',
          'tests/test_run_actor_learner.py']


@dataclasses.dataclass(frozen=True)
class Mutant:
  name: str
  path: str
  old: str          # exact text, must occur once in the file
  new: str
  what: str         # the defect, in words
  tests: tuple = tuple(LEARNER)


# Which test file speaks first for a mutated module (pytest -x stops at the
# first failure, so the first file that fails is the one reported).
_FIRST = {'agent/actor_critic.py': 'tests/test_actor_critic.py',
          'agent/distributions.py': 'tests/test_distributions.py',
          'agent/optimizer.py': 'tests/test_optimizer.py',
          'agent/rssm.py': 'tests/test_rssm.py',
          'agent/world_model.py': 'tests/test_learning.py',
          'agent/learning.py': 'tests/test_learning.py',
          'agent/config.py': 'tests/test_spec_config.py'}


def M(name, path, old, new, what, tests=None):
  """The learner's files by default: the mutated module's own unit tests,
  then tests/test_learning.py (the literal reference and the routing matrix
  come first there), then the rest, the spec table last (first for a
  config default)."""
  if tests is None:
    first = _FIRST.get(path)
    order = list(dict.fromkeys(([first] if first else []) + ['tests/test_learning.py']))
    tests = order + [t for t in LEARNER if t not in order
                     and t != 'tests/test_spec_config.py']
    if 'tests/test_spec_config.py' not in tests:
      tests.append('tests/test_spec_config.py')
  return Mutant(name, path, old, new, what, tuple(tests))


MUTANTS: List[Mutant] = [
    # --- world model (Algorithm E, spec 2.13-2.16) ---
    M('dyn_rep_sg_swapped', 'agent/world_model.py',
      'dyn = dists.onehot_kl(sg(post), prior, c.unimix)\n  rep = dists.onehot_kl(post, sg(prior), c.unimix)',
      'dyn = dists.onehot_kl(post, sg(prior), c.unimix)\n  rep = dists.onehot_kl(sg(post), prior, c.unimix)',
      'dyn / rep stop-gradients swapped (spec 2.14)'),
    M('heads_cut_from_rssm', 'agent/world_model.py',
      'feat = nets_lib.feat(deter, stoch)                              # not sg',
      'feat = nets_lib.feat(sg(deter), sg(stoch))                      # not sg',
      'reward and continue heads on stop-gradient features (spec 2.16)'),
    M('con_soft_label_dropped', 'agent/world_model.py',
      'cont = cont * c.gamma', 'cont = cont',
      'continue target 1 - terminal instead of 0.997 (1 - terminal) (spec 2.13)'),
    M('rep_without_free_bits', 'agent/world_model.py',
      "'rep': jnp.maximum(rep, c.free_nats)}", "'rep': rep}",
      'rep loss without free bits (spec 2.14)'),
    M('free_nats_half', 'agent/config.py',
      'free_nats: float = 1.0', 'free_nats: float = 0.5',
      'free nats 1.0 -> 0.5 (spec 2.14)'),
    M('rep_scale_is_dyn_scale', 'agent/learning.py',
      "'rep': config.loss_rep,", "'rep': config.loss_dyn,",
      'rep loss scaled by the dyn scale 1.0 instead of 0.1 (spec 4.1)'),
    M('repval_scale', 'agent/config.py',
      'loss_repval: float = 0.3', 'loss_repval: float = 1.0',
      'replay critic scale 0.3 -> 1.0 (spec 3.19)'),
    M('symlog_mse_half', 'agent/distributions.py',
      'err = (pred - sg(symlog(jnp.asarray(target, f32)))) ** 2',
      'err = 0.5 * (pred - sg(symlog(jnp.asarray(target, f32)))) ** 2',
      'symlog MSE with the paper\'s 1/2 (spec 1.11, OQ 3)'),
    # --- replay context (spec 5.8, Algorithm J) ---
    M('context_prevact_shifted', 'agent/learning.py',
      "prevact = batch['action'][:, :-1]", "prevact = batch['action'][:, 1:]",
      'prevact of obs_t is a_t instead of a_{t-1} (spec 5.8)'),
    M('context_zero_start', 'agent/learning.py',
      "ctx = jax.tree_util.tree_map(lambda x: x[:, 0], batch['latent'])",
      "ctx = jax.tree_util.tree_map(lambda x: x[:, 0] * 0, batch['latent'])",
      'replay context ignored: zero start latent (spec 5.8)'),
    M('is_first_not_reset', 'agent/rssm.py',
      'keep = (~is_first)[:, None].astype(deter.dtype)',
      'keep = jnp.ones_like(is_first)[:, None].astype(deter.dtype)',
      'observe step does not zero the state at is_first (spec 2.2)'),
    M('action_not_normalised', 'agent/rssm.py',
      'a = a / sg(jnp.maximum(1.0, jnp.abs(a)))', 'a = a',
      'action input not divided by max(1, |a|) (spec 2.3)'),
    M('gru_update_bias', 'agent/rssm.py',
      'u = _sigmoid(u - 1)', 'u = _sigmoid(u)',
      'GRU update gate without the -1 offset (spec 2.4)'),
    # --- actor-critic (spec 3, Algorithms F-H) ---
    M('lambda_return_reward_index', 'agent/actor_critic.py',
      'interm = rew[:, 1:] + (1.0 - cont) * live * boot[:, 1:]',
      'interm = rew[:, :-1] + (1.0 - cont) * live * boot[:, 1:]',
      'lambda-return uses r_t instead of r_{t+1} (spec 3.7)'),
    M('lambda_return_cont_index', 'agent/actor_critic.py',
      'cont = (1.0 - last)[:, 1:] * lam', 'cont = (1.0 - last)[:, :-1] * lam',
      'lambda-return episode end read at t instead of t+1 (spec 3.19)'),
    M('lambda_value', 'agent/config.py',
      '  lam: float = 0.95', '  lam: float = 0.9',
      'imagination lambda 0.95 -> 0.9 (spec 3.7)'),
    M('retnorm_percentile', 'agent/config.py',
      'retnorm_perchi: float = 95.0', 'retnorm_perchi: float = 90.0',
      'return normaliser P95 -> P90 (spec 3.8)'),
    M('retnorm_decay_swapped', 'agent/actor_critic.py',
      'new = RetNormState((1 - r) * state.lo + r * lo_b, (1 - r) * state.hi + r * hi_b)',
      'new = RetNormState(r * state.lo + (1 - r) * lo_b, r * state.hi + (1 - r) * hi_b)',
      'return normaliser EMA decay 0.01 instead of 0.99 (spec 3.8)'),
    M('retnorm_rate', 'agent/config.py',
      'retnorm_rate: float = 0.01', 'retnorm_rate: float = 0.02',
      'return normaliser rate 0.01 -> 0.02 (spec 3.8)'),
    M('advantage_baseline_index', 'agent/actor_critic.py',
      'adv = (ret - v_on[:-1]) / scale', 'adv = (ret - v_on[1:]) / scale',
      'advantage baseline v(s_{t+1}) instead of v(s_t) (spec 3.10)'),
    M('contdisc_discount_twice', 'agent/actor_critic.py',
      'disc = 1.0 if config.contdisc else config.gamma', 'disc = config.gamma',
      'explicit gamma on top of the 0.997 continue target (spec 3.6)'),
    M('repval_mask_terminal', 'agent/actor_critic.py',
      'mask = 1.0 - is_last[:, :-1].astype(jnp.float32)',
      'mask = 1.0 - is_terminal[:, :-1].astype(jnp.float32)',
      'replay critic masked by is_terminal instead of is_last (spec 3.19)'),
    M('repval_boot_last_state', 'agent/learning.py',
      'boot=ret[0].reshape(B, T)', 'boot=ret[-1].reshape(B, T)',
      'replay bootstrap R_{H-1} instead of R_0 (spec 3.19)'),
    M('start_con_from_is_last', 'agent/learning.py',
      'con0 = 1.0 - is_terminal.reshape(N).astype(jnp.float32)',
      'con0 = 1.0 - is_last.reshape(N).astype(jnp.float32)',
      'start-state continuation from is_last instead of is_terminal (OQ 6)'),
    M('slow_rate', 'agent/config.py',
      'slow_rate: float = 0.02', 'slow_rate: float = 0.03',
      'slow critic rate 0.02 -> 0.03 (spec 3.18)'),
    M('slow_ema_before_step', 'agent/learning.py',
      'state.slow_params, val_params(params))',
      'state.slow_params, val_params(state.params))',
      'slow critic EMA of the params before the optimizer step (spec 3.18)'),
    M('policy_std_offset', 'agent/distributions.py',
      'jax.nn.sigmoid(std_raw.astype(f32) + 2.0)', 'jax.nn.sigmoid(std_raw.astype(f32))',
      'policy std without the +2 offset (spec 3.13)'),
    M('actent', 'agent/config.py',
      'actent: float = 3e-4', 'actent: float = 3e-3',
      'entropy scale 3e-4 -> 3e-3 (spec 3.12)'),
    # --- distributions (spec 1.8, 1.9) ---
    M('unimix_not_divided', 'agent/distributions.py',
      'return (1 - unimix) * probs + unimix / logits.shape[-1]',
      'return (1 - unimix) * probs + unimix',
      'unimix adds 0.01 instead of 0.01 / C (spec 1.8)'),
    M('unimix_off', 'agent/config.py',
      'unimix: float = 0.01            # latent unimix',
      'unimix: float = 0.0             # latent unimix',
      'latent unimix 1 % -> 0 (spec 1.8)'),
    M('twohot_bins_range', 'agent/distributions.py',
      'x = np.linspace(-20.0, 0.0, (n + 1) // 2, dtype=np.float32)',
      'x = np.linspace(-15.0, 0.0, (n + 1) // 2, dtype=np.float32)',
      'two-hot bins span symlog [-15, 15] instead of [-20, 20] (spec 1.9)'),
    M('twohot_weights_swapped', 'agent/distributions.py',
      'return below, above, sg(d_above / total), sg(d_below / total)',
      'return below, above, sg(d_below / total), sg(d_above / total)',
      'two-hot weights on the far neighbour (Algorithm D)'),
    # --- optimizer (spec 4.3-4.7, Algorithm I) ---
    M('optimizer_order', 'agent/optimizer.py',
      'scale_by_rms(beta2, eps),\n      scale_by_momentum(beta1),',
      'scale_by_momentum(beta1),\n      scale_by_rms(beta2, eps),',
      'momentum before RMS (Adam order, not LaProp; spec 4.3)'),
    M('agc_on_grad_norm', 'agent/optimizer.py',
      'upper = clip * jnp.maximum(pmin, tensor_norm(p))',
      'upper = clip * jnp.maximum(pmin, tensor_norm(g))',
      'AGC relative to the gradient norm, not the parameter norm (spec 4.4)'),
    M('rms_no_bias_correction', 'agent/optimizer.py',
      'corr = 1 - beta2 ** count.astype(jnp.float32)', 'corr = 1.0',
      'RMS step without bias correction (spec 4.5)'),
    M('momentum_no_bias_correction', 'agent/optimizer.py',
      'return jax.tree_util.tree_map(lambda m: m / corr, mu), MomentState(count, mu)',
      'return jax.tree_util.tree_map(lambda m: m, mu), MomentState(count, mu)',
      'momentum without bias correction (spec 4.6)'),
    M('warmup_from_lr', 'agent/optimizer.py',
      'optax.linear_schedule(0.0, lr, warmup)', 'optax.linear_schedule(lr, lr, warmup)',
      'no warm-up: the first update has the full lr (spec 4.7)'),
    M('warmup_length', 'agent/config.py',
      'warmup: int = 1000', 'warmup: int = 100',
      'warm-up 1000 -> 100 updates (spec 4.7)'),
    # --- replay and the schedule (spec 5.3, 5.4, 5.9, 6.1, 6.2) ---
    M('ratio_first_call', 'experiments/layouts/scheduled.py',
      '      self._prev = step\n      return 1', '      self._prev = step\n      return 0',
      'first eligible Ratio call returns 0, not 1 (spec 6.1)', tuple(REPLAY)),
    M('ratio_drift', 'experiments/layouts/scheduled.py',
      'self._prev += repeats / self._ratio', 'self._prev = step',
      'Ratio restarts from the step (loses the fraction, drifts; spec 6.1)',
      tuple(REPLAY)),
    M('train_gate', 'experiments/layouts/scheduled.py',
      'if num_items < self._fill:', 'if num_items <= self._fill:',
      'training starts one item after train_fill (spec 6.2)', tuple(REPLAY)),
    M('online_share_not_subtracted', 'agent/builder.py',
      'spi = rows - 1.0 / c.seq_len', 'spi = rows - 0.0 / c.seq_len',
      'limiter counts online rows on top of the ratio (spec 5.4, 6.1)',
      tuple(REPLAY)),
    M('online_queue_start', 'reverb_tables/adder.py',
      'if self._online and n % self._length == 0:',
      'if self._online and n % self._length == 1:',
      'online queue windows start at 2, 67, ... not 1, 66, ... (spec 5.4)',
      tuple(REPLAY)),
    M('annotate_is_last', 'reverb_tables/sampler.py',
      'nxt[:, :-1] = is_first[:, 1:]', 'nxt[:, :-1] = is_first[:, :-1]',
      'is_last marks the is_first step, not the step before it (spec 5.3)',
      tuple(REPLAY)),
    M('write_back_index', 'agent/learner.py',
      'host_ids = ids[:, 1:]', 'host_ids = ids[:, :-1]',
      'write-back to indices 0..T-1 instead of 1..T (spec 5.9)', tuple(REPLAY)),
    # --- image encoder / decoder (spec 2.10, agent/cnn.py) ---
    M('cnn_input_not_centred', 'agent/cnn.py',
      'x = images.astype(dtype) / 255 - 0.5', 'x = images.astype(dtype) / 255',
      'image input scaled to [0, 1] instead of /255 - 0.5 (spec 2.10)', CNN),
    M('cnn_avg_pool', 'agent/cnn.py',
      "return x.reshape((n, h // 2, 2, w // 2, 2, c)).max((2, 4))",
      "return x.reshape((n, h // 2, 2, w // 2, 2, c)).mean((2, 4))",
      'average instead of max pooling (spec 2.10)', CNN),
    M('cnn_norm_before_pool', 'agent/cnn.py',
      "x = _norm_act(_max_pool(_conv(x, layer)), layer['scale'], eps)",
      "x = _max_pool(_norm_act(_conv(x, layer), layer['scale'], eps))",
      'encoder RMSNorm + SiLU before the pool instead of after (spec 2.10)', CNN),
    M('cnn_mults_first_stage', 'agent/cnn.py',
      'MULTS = (2, 3, 4, 4)', 'MULTS = (1, 3, 4, 4)',
      "first stage d/16 channels (the paper's) instead of HEAD's 2 d/16 (spec 2.10)",
      CNN),
    M('cnn_kernel_3', 'agent/cnn.py', 'KERNEL = 5', 'KERNEL = 3',
      'kernel 3 instead of 5 (spec 2.10)', CNN),
    M('cnn_conv_fan_in_channels', 'agent/cnn.py',
      'blocks.kernel_init(KERNEL * KERNEL * cin, outscale)',
      'blocks.kernel_init(cin, outscale)',
      'conv init fan_in = cin instead of k*k*cin (spec 1.5)', CNN),
    M('dec_block_layout_transposed', 'agent/cnn.py',
      'x0 = jnp.moveaxis(x0, 1, 3).reshape((-1, h, w, c_last))    # h w (g c)',
      'x0 = jnp.moveaxis(x0, 1, 4).reshape((-1, h, w, c_last))    # h w (g c)',
      "spatial projection rearranged '(g h w c) -> h w (c g)' (spec 2.10)", CNN),
    M('dec_stoch_branch_dropped', 'agent/cnn.py',
      "x = _norm_act(x0 + x1, W['spnorm'], eps)",
      "x = _norm_act(x0, W['spnorm'], eps)",
      'decoder spatial projection without the stoch MLP branch (spec 2.10)', CNN),
    M('dec_no_sigmoid', 'agent/cnn.py',
      "x = jax.nn.sigmoid(_upsample_conv(x, W['imgout']).astype(jnp.float32))",
      "x = _upsample_conv(x, W['imgout']).astype(jnp.float32)",
      'decoder output without the sigmoid (spec 2.10)', CNN),
    M('dec_phase_taps_swapped', 'agent/cnn.py',
      "y = y.reshape(n, h, wd, 2, 2, cout).transpose(0, 1, 3, 2, 4, 5)",
      "y = y.reshape(n, h, wd, 2, 2, cout).transpose(0, 1, 4, 2, 3, 5)",
      'decoder upsampling phases interleaved on the wrong axes (spec 2.10)', CNN),
    M('image_loss_mean', 'agent/cnn.py',
      'return jnp.square(pred - target).sum((-3, -2, -1))',
      'return jnp.square(pred - target).mean((-3, -2, -1))',
      'image loss averaged over H, W, C instead of summed (spec 2.10)', CNN),
    M('image_target_unscaled', 'agent/cnn.py',
      'target = jax.lax.stop_gradient(image.astype(jnp.float32) / 255)',
      'target = jax.lax.stop_gradient(image.astype(jnp.float32) / 255 - 0.5)',
      'image loss target centred like the encoder input (spec 2.10)', CNN),
    M('image_keys_unsorted', 'agent/cnn.py',
      'return jnp.concatenate([obs[k] for k in sorted(keys)], -1)',
      'return jnp.concatenate([obs[k] for k in sorted(keys, reverse=True)], -1)',
      'image keys concatenated in reverse order, not sorted (spec 2.10)', CNN),
    M('img_outscale', 'agent/config.py',
      "outscale_img: float = 1.0", "outscale_img: float = 0.1",
      "imgout outscale 0.1 (the vector decoder's OQ 7 value) instead of 1.0 "
      '(spec 1.5)', CNN),
    M('tokens_cnn_first', 'agent/networks.py',
      'return parts[0] if len(parts) == 1 else jnp.concatenate(parts, -1)',
      'return parts[0] if len(parts) == 1 else jnp.concatenate(parts[::-1], -1)',
      'CNN features before the vector tokens (spec 2.9: after)', CNN),
]


def _load():
  try:
    return os.getloadavg()
  except OSError:
    return (float('nan'),) * 3


def make_scratch(dest: str, tests_rev: Optional[str]) -> None:
  """The working tree's tracked and untracked (not ignored) files; tests/ from
  ``tests_rev`` when given."""
  files = subprocess.run(['git', 'ls-files', '-z', '-c', '-o', '--exclude-standard'],
                         cwd=REPO, check=True, capture_output=True).stdout
  for rel in files.decode().split('\0'):
    if not rel or not os.path.isfile(os.path.join(REPO, rel)):
      continue
    if tests_rev and rel.startswith('tests/'):
      continue
    os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
    shutil.copy2(os.path.join(REPO, rel), os.path.join(dest, rel))
  if tests_rev:
    archive = subprocess.run(['git', 'archive', tests_rev, 'tests'], cwd=REPO,
                             check=True, capture_output=True).stdout
    subprocess.run(['tar', '-x', '-C', dest], input=archive, check=True)


def run_tests(scratch: str, tests, cache: str, timeout: float):
  """(passed, first failing test or reason, seconds)."""
  tests = [t for t in tests if os.path.exists(os.path.join(scratch, t))]
  env = {**os.environ, 'PYTHONPATH': scratch, 'DREAMER_TEST_JAX_CACHE': cache,
         'PYTHONDONTWRITEBYTECODE': '1'}
  cmd = [sys.executable, '-m', 'pytest', '-q', '-x', '-m', 'not slow', '-rfE',
         '-p', 'no:cacheprovider', *tests]
  t0 = time.monotonic()
  try:
    out = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True,
                         timeout=timeout, start_new_session=True)
  except subprocess.TimeoutExpired:
    return False, f'timeout after {timeout:.0f} s', time.monotonic() - t0
  secs = time.monotonic() - t0
  failed = re.findall(r'^(?:FAILED|ERROR) (\S+)', out.stdout, re.M)
  if out.returncode == 0:
    return True, None, secs
  return False, (failed[0] if failed else
                 f'exit {out.returncode}: {out.stdout[-300:]}{out.stderr[-300:]}'), secs


def apply(scratch: str, m: Mutant) -> tuple:
  path = os.path.join(scratch, m.path)
  with open(path) as f:
    text = f.read()
  if text.count(m.old) != 1:
    raise ValueError(f'{m.name}: {m.old!r} occurs {text.count(m.old)} times in {m.path}')
  line = text[:text.index(m.old)].count('\n') + 1
  with open(path, 'w') as f:
    f.write(text.replace(m.old, m.new))
  return text, line


def write(out, label, head, tests_rev, baseline, rows):
  """Writes mutants_<label>.json and .md (in the MUTANTS order); returns the
  number caught."""
  order = {m.name: i for i, m in enumerate(MUTANTS)}
  rows = sorted(rows, key=lambda r: order.get(r['name'], len(order)))
  caught = sum(r['caught'] for r in rows)
  result = dict(label=label, code=head, tests_rev=tests_rev or 'working tree',
                caught=caught, total=len(rows), listed=len(MUTANTS),
                unmutated_seconds=baseline, cpus=os.cpu_count(), rows=rows)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, f'mutants_{label}.json'), 'w') as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(out, f'mutants_{label}.md'), 'w') as f:
    f.write(f'# Mutation score: {caught} / {len(rows)} caught '
            f'({len(rows)} of the {len(MUTANTS)} listed mutants run)\n\n'
            f'Code at {head}, tests from {result["tests_rev"]}; '
            f'`python bench/mutants.py{" --tests_rev=" + tests_rev if tests_rev else ""}`. '
            f'Seconds are wall time of `pytest -x` on the mutant\'s test files '
            f'(shared JAX cache), on a {os.cpu_count()}-core machine with the '
            f'1-minute load shown.\n\n'
            '| mutant | where | defect | caught by | s | load |\n'
            '| --- | --- | --- | --- | --- | --- |\n')
    for r in rows:
      by = f'`{r["caught_by"]}`' if r['caught'] else '**survived**'
      f.write(f'| {r["name"]} | {r["where"]} | {r["what"]} | {by} | '
              f'{r["seconds"]:.0f} | {r["load"]:.1f} |\n')
  return caught


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--tests_rev', default=None,
                      help='take tests/ from this commit (the "before" score)')
  parser.add_argument('--label', default=None, help='results file suffix')
  parser.add_argument('--only', default='', help='comma-separated mutant names')
  parser.add_argument('--timeout', type=float, default=1200.0)
  parser.add_argument('--out', default=os.path.join(REPO, 'bench', 'results'))
  parser.add_argument('--resume', action='store_true',
                      help='keep the rows of an earlier run with this label')
  args = parser.parse_args(argv)
  label = args.label or ('tests_' + args.tests_rev if args.tests_rev else 'current')
  mutants = [m for m in MUTANTS if not args.only or m.name in args.only.split(',')]
  unknown = set(filter(None, args.only.split(','))) - {m.name for m in MUTANTS}
  if unknown:
    parser.error(f'unknown mutants {sorted(unknown)}')
  names = [m.name for m in MUTANTS]
  assert len(names) == len(set(names)), 'duplicate mutant names'
  json_path = os.path.join(args.out, f'mutants_{label}.json')
  rows, baseline = [], {}
  if args.resume and os.path.exists(json_path):
    with open(json_path) as f:
      earlier = json.load(f)
    rows, baseline = earlier['rows'], earlier['unmutated_seconds']
  done = {r['name'] for r in rows}

  work = tempfile.mkdtemp(prefix='dreamer-mutants-')
  scratch = os.path.join(work, 'repo')
  cache = os.path.join(work, 'jax_cache')
  os.makedirs(cache)
  make_scratch(scratch, args.tests_rev)
  head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO,
                        capture_output=True, text=True).stdout.strip()
  # Every mutant must apply, and the unmutated copy must pass its tests
  # (checked once per label; --resume keeps the earlier check).
  for m in mutants:
    original, _ = apply(scratch, m)
    with open(os.path.join(scratch, m.path), 'w') as f:
      f.write(original)
  if not baseline:
    union = []
    for m in mutants:
      union += [t for t in m.tests if t not in union]
    ok, why, secs = run_tests(scratch, union, cache, args.timeout)
    baseline = {' '.join(union): round(secs, 1)}
    print(f'unmutated, {len(union)} files: {"pass" if ok else why} ({secs:.0f} s)',
          flush=True)
    if not ok:
      raise SystemExit(f'the unmutated tree fails its tests: {why}')

  for m in mutants:
    if m.name in done:
      continue
    original, line = apply(scratch, m)
    load = _load()[0]
    try:
      ok, failing, secs = run_tests(scratch, m.tests, cache, args.timeout)
    finally:
      with open(os.path.join(scratch, m.path), 'w') as f:
        f.write(original)
    rows.append(dict(name=m.name, where=f'{m.path}:{line}', what=m.what,
                     old=m.old, new=m.new, caught=not ok, caught_by=failing,
                     seconds=round(secs, 1), load=round(load, 2)))
    print(f'{m.name:32s} {"CAUGHT " if not ok else "SURVIVED"} {secs:6.0f} s '
          f'load {load:.1f}  {failing or ""}', flush=True)
    write(args.out, label, head, args.tests_rev, baseline, rows)
  caught = write(args.out, label, head, args.tests_rev, baseline, rows)
  print(f'{caught} / {len(rows)} caught', flush=True)
  shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
  main()
