"""bench/ tools, no timings: HLO parsing (dots, their layouts and executions), parity statistics, the learning-signal table, the learner-rows table and the random-policy baseline."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import dot_ceiling


def _program(x, w, v):
  def body(h, _):
    return jnp.tanh(h @ w), None             # one [8, 32] x [32, 32] dot per step
  h, _ = jax.lax.scan(body, x, None, length=7)
  return (h.T @ v).sum()                     # one dot outside, lhs read transposed


def test_collect_dots_counts_trips_shapes_and_flops():
  x = jnp.ones((8, 32), jnp.float32)
  w = jnp.ones((32, 32), jnp.float32)
  v = jnp.ones((8, 16), jnp.float32)
  text = jax.jit(_program).lower(x, w, v).compile().as_text()
  dots = dot_ceiling.collect_dots(text)
  per_sig = {}
  for sig, n, _, _ in dots:
    per_sig[sig] = per_sig.get(sig, 0) + n
  loop = [(s, n) for s, n in per_sig.items() if n == 7]
  assert len(loop) == 1, per_sig
  sig, _ = loop[0]
  assert dot_ceiling._flops(sig) == 2 * 8 * 32 * 32
  assert dot_ceiling._is_matrix_product(sig)
  outside = [s for s, n in per_sig.items() if n == 1 and dot_ceiling._flops(s) == 2 * 32 * 8 * 16]
  assert outside, per_sig


def test_time_dot_reproduces_a_transposed_layout():
  # lhs [4, 3] stored column-major ({0,1}): the timed product must accept it.
  sig = (((4, 3), (0, 1)), ((3, 5), (1, 0)), (1,), (0,), (), ())
  t = dot_ceiling.time_dot(sig, 0.001)
  assert np.isfinite(t) and t > 0


def test_parity_bins_by_updates_maps_names_and_widens_the_band():
  """bench/parity.py: rows of means over 50 updates re-binned into
  250-update windows weighted by their update counts, the official and our
  metric names mapped to one name, and the acceptance band."""
  from bench import parity

  def rows(side, value_of):
    out = []
    for end in range(50, 501, 50):
      n = 50 if end != 300 else 25          # a short window (e.g. a resume)
      r = {'updates': end, 'n': n, 'env_step': 8 * end}
      if side == 'ours':
        r.update({'train/loss/dyn': value_of(end), 'train/loss/rec_position': 1.0,
                  'train/policy_entropy': 2.0})
      else:
        r.update({'loss/dyn': value_of(end), 'loss/position': 1.0, 'ent/action': 2.0})
      out.append(r)
    return {'side': side, 'rows': out, 'scores': []}

  for side in ('ours', 'official'):
    b = parity.binned(rows(side, float), 500)
    assert set(b) == {'loss/dyn', 'loss/rec_position', 'policy_entropy'}
    np.testing.assert_allclose(b['loss/dyn'][0], 150.0)             # 50..250
    w = np.array([25, 50, 50, 50, 50])                              # 300 (short)..500
    np.testing.assert_allclose(b['loss/dyn'][1],
                               (w * [300, 350, 400, 450, 500]).sum() / w.sum())
  official = np.array([[1.0, 10.0], [1.2, 10.0]])
  mean, lo, hi = parity.band(official)
  np.testing.assert_allclose(mean, [1.1, 10.0])
  np.testing.assert_allclose(lo, [1.0 - 0.2, 10.0 - 1.0])    # spread 0.2 > 10 % of 1.1
  np.testing.assert_allclose(hi, [1.2 + 0.2, 10.0 + 1.0])    # 10 % of 10 > spread 0


def test_parity_holm_step_down_on_known_p_values():
  """Holm's adjusted p-values, worked by hand: m = 4 finite
  p-values sorted 0.005, 0.01, 0.03, 0.04 give 4 x 0.005 = 0.02,
  max(0.02, 3 x 0.01) = 0.03, max(0.03, 2 x 0.03) = 0.06, max(0.06, 0.04)
  = 0.06; a NaN (an untested check) stays NaN and does not count in m."""
  from bench import parity
  np.testing.assert_allclose(parity.holm([0.01, np.nan, 0.04, 0.03, 0.005]),
                             [0.03, np.nan, 0.06, 0.06, 0.02])
  np.testing.assert_allclose(parity.holm([0.5, 0.6]), [1.0, 1.0])  # capped at 1
  np.testing.assert_allclose(parity.holm([0.2, 0.2, 0.2]), [0.6, 0.6, 0.6])  # ties
  np.testing.assert_allclose(parity.holm([0.001]), [0.001])        # m = 1: unchanged
  assert parity.holm([]).shape == (0,)


def test_parity_welch_on_a_hand_computed_example():
  """Welch's t-test: means 2.5 and 6, variances 5/3 (n 4) and
  10 (n 5): t = -3.5 / sqrt(5/12 + 2) = -2.2514, Welch-Satterthwaite
  df = 5.5208, two-sided p = 0.06913. Undefined (NaN) with one seed on a
  side or no spread on either side; a NaN seed (no rows) is dropped."""
  from bench import parity
  t, p = parity.welch(np.array([1.0, 2.0, 3.0, 4.0]),
                      np.array([2.0, 4.0, 6.0, 8.0, 10.0]))
  np.testing.assert_allclose(t, -2.2514363, rtol=1e-6)
  np.testing.assert_allclose(p, 0.0691336, rtol=1e-5)
  t2, p2 = parity.welch(np.array([1.0, 2.0, 3.0, 4.0, np.nan]),
                        np.array([2.0, 4.0, 6.0, 8.0, 10.0]))
  assert (t2, p2) == (t, p)
  assert all(np.isnan(parity.welch(np.array([1.0]), np.array([1.0, 2.0]))))
  assert all(np.isnan(parity.welch(np.ones(3), np.ones(3))))


def test_parity_compare_reports_welch_and_holm_per_check(tmp_path):
  """`compare`: per metric and 500-update check, a Welch p and a
  Holm-adjusted p over every check of the comparison; the per-key
  reconstruction losses are in the table; the band check stays."""
  import json
  from bench import parity
  rng = np.random.default_rng(0)

  def result(side, seed, shift):
    rows = []
    for end in range(50, 1001, 50):
      r = {'updates': end, 'n': 50, 'env_step': 8 * end}
      dyn = 1.0 + 0.01 * rng.standard_normal()
      rec = 0.5 + shift + 0.001 * rng.standard_normal()
      if side == 'ours':
        r.update({'train/loss/dyn': dyn, 'train/loss/rec_height': rec})
      else:
        r.update({'loss/dyn': dyn, 'loss/height': rec})
      rows.append(r)
    return {'side': side, 'task': 'toy', 'seed': seed, 'updates': 1000,
            'variant': 'official_oq' if side == 'ours' else 'official',
            'overrides': [], 'wall_s': 1.0, 'rows': rows, 'scores': []}

  for seed in range(4):
    for side, shift in (('ours', 0.1), ('official', 0.0)):
      name = parity.run_name(side, 'toy', seed, 'official_oq')
      with open(tmp_path / f'{name}.json', 'w') as f:
        json.dump(result(side, seed, shift), f)
  parity.main(['compare', '--task=toy', '--length=1000', f'--out={tmp_path}',
               '--table_at', '500', '1000'])
  with open(tmp_path / 'compare_toy_official_oq_1000.json') as f:
    report = json.load(f)
  rec, dyn = report['metrics']['loss/rec_height'], report['metrics']['loss/dyn']
  assert rec['updates'] == [500, 1000]
  # 0.1 apart with ~0.0005 noise: a tiny p, still tiny after x 4 (Holm, m = 4)
  assert all(p < 1e-6 for p in rec['welch_p'])
  assert all(p < ALPHA_TEST for p in rec['holm_p'])
  assert all(ph >= p for ph, p in zip(rec['holm_p'], rec['welch_p']))
  assert all(ph >= ALPHA_TEST for ph in dyn['holm_p'])  # same distribution (rng seed 0)
  assert rec['inside'] == [False, False]                          # band check stays
  st = report['stats']
  assert st['tests'] == 4 and st['untested'] == 2      # 'score': no episodes here
  assert all(np.isnan(report['metrics']['score']['holm_p']))
  assert sorted((n, u) for n, u, _, _ in st['significant']) == [
      ('loss/rec_height', 500), ('loss/rec_height', 1000)]
  table = parity.table(report, [500, 1000])
  assert '| loss/rec_height |' in table and 'Holm p' in table


ALPHA_TEST = 0.05


def test_parity_load_counts_a_probe_run_as_its_variants_seed_once(tmp_path):
  """bench/parity.py load: a --probe run is a seed of its variant;
  a seed with a plain and a probe run is counted once, the plain run kept;
  runs short of the length are left out."""
  import json
  from bench import parity

  def write(name, side, seed, probe=False, updates=3000, overrides=()):
    r = {'side': side, 'seed': seed, 'variant': 'official_oq', 'updates': updates,
         'overrides': list(overrides), 'flags': [], 'probe': probe, 'rows': []}
    (tmp_path / f'walker_walk_{name}.json').write_text(json.dumps(r))

  write('official_s0', 'official', 0)
  write('official_s1', 'official', 1, updates=2000)              # too short
  write('ours_official_oq_s0', 'ours', 0)
  write('ours_official_oq_probe_s0', 'ours', 0, probe=True)      # same seed: dropped
  write('ours_official_oq_probe_s2', 'ours', 2, probe=True)
  write('ours_official_oq_lr-1_s0', 'ours', 0, overrides=['lr=1'])
  runs = parity.load(str(tmp_path), 'walker_walk', 3000)
  assert sorted(runs) == ['official', 'official_oq', 'official_oq_lr-1']
  assert [r['seed'] for r in runs['official']] == [0]
  assert [(r['seed'], r['probe']) for r in runs['official_oq']] == [(0, False), (2, True)]


def test_parity_pixel_runs_are_named_built_and_loaded_apart(tmp_path):
  """bench/parity.py --pixels: a pixel run is named apart, trains from the
  image only on both sides (ours --image --noproprio; the official
  dmc_vision semantics at size1m), and `load` never mixes pixel and proprio
  runs (a JSON without 'pixels' is a proprio run)."""
  import json
  from bench import parity
  assert (parity.run_name('official', 'cartpole_swingup', 0, pixels=True)
          == 'cartpole_swingup_pixels_official_s0')
  assert (parity.run_name('ours', 'cartpole_swingup', 1, 'official_oq', pixels=True)
          == 'cartpole_swingup_pixels_ours_official_oq_s1')
  assert parity.run_name('ours', 'x', 0, 'defaults') == 'x_ours_defaults_s0'

  ours = parity.ours_argv('cartpole_swingup', 0, '/tmp/l', 60, 'official_oq', [],
                          pixels=True)
  assert '--image' in ours and '--noproprio' in ours
  assert '--image' not in parity.ours_argv('cartpole_swingup', 0, '/tmp/l', 60,
                                           'official_oq', [])
  off = parity.official_argv('cartpole_swingup', 0, '/tmp/l', pixels=True)
  configs = off[off.index('--configs') + 1:off.index('--configs') + 3]
  assert configs == ['dmc_vision', 'size1m']
  assert off[off.index('--env.dmc.proprio') + 1] == 'False'
  assert off[off.index('--env.dmc.image') + 1] == 'True'
  plain = parity.official_argv('cartpole_swingup', 0, '/tmp/l')
  assert plain[plain.index('--configs') + 1] == 'dmc_proprio'
  assert '--env.dmc.proprio' not in plain
  # equal settings otherwise
  assert off[off.index('--task'):] == plain[plain.index('--task'):]

  def write(name, side, pixels=None):
    r = {'side': side, 'seed': 0, 'variant': 'official_oq', 'updates': 1500,
         'overrides': [], 'flags': [], 'probe': False, 'rows': []}
    if pixels is not None:
      r['pixels'] = pixels
    (tmp_path / f'{name}.json').write_text(json.dumps(r))

  write('cartpole_swingup_official_s0', 'official')            # older proprio JSON
  write('cartpole_swingup_ours_official_oq_s0', 'ours', False)
  write('cartpole_swingup_pixels_official_s0', 'official', True)
  write('cartpole_swingup_pixels_ours_official_oq_s0', 'ours', True)
  for pixels in (False, True):
    runs = parity.load(str(tmp_path), 'cartpole_swingup', 1500, pixels)
    assert sorted(runs) == ['official', 'official_oq']
    assert all(r.get('pixels', False) == pixels for rs in runs.values() for r in rs)


def test_parity_compare_pixels_maps_the_image_loss_on_small_windows(tmp_path):
  """`compare --pixels` on tiny runs (--bin / --check_every below the
  defaults, as for a smoke test): ours' train/loss/rec_image and the
  official loss/image are one metric, loss/rec_image; proprio runs in the
  same folder are left out; the report says it is a pixel comparison."""
  import json
  from bench import parity

  def write(side, seed, pixels, value):
    key = 'train/loss/rec_image' if side == 'ours' else 'loss/image'
    if not pixels:
      key = 'train/loss/rec_position' if side == 'ours' else 'loss/position'
    rows = [{'updates': u, 'n': 50, 'env_step': 8 * u, key: value + 0.01 * seed}
            for u in (50, 100)]
    r = {'side': side, 'task': 'toy', 'seed': seed, 'updates': 100,
         'variant': 'official_oq' if side == 'ours' else 'official',
         'overrides': [], 'flags': [], 'probe': False, 'pixels': pixels,
         'wall_s': 1.0, 'rows': rows, 'scores': []}
    name = parity.run_name(side, 'toy', seed, 'official_oq', pixels=pixels)
    (tmp_path / f'{name}.json').write_text(json.dumps(r))

  for seed in (0, 1):
    write('official', seed, True, 100.0)
    write('ours', seed, True, 110.0)
    write('official', seed, False, 1.0)
    write('ours', seed, False, 1.0)
  parity.main(['compare', '--task=toy', '--pixels', '--length=100', '--bin=50',
               '--check_every=100', f'--out={tmp_path}', '--table_at', '100'])
  with open(tmp_path / 'compare_toy_pixels_official_oq_100.json') as f:
    report = json.load(f)
  assert report['pixels'] and report['bin'] == 50 and report['seeds'] == {
      'official': 2, 'official_oq': 2}
  rec = report['metrics']['loss/rec_image']
  assert rec['updates'] == [100]
  np.testing.assert_allclose(rec['ours_mean'], [110.005])
  np.testing.assert_allclose(rec['official_mean'], [100.005])
  assert 'loss/rec_position' not in report['metrics']


def test_signal_plot_windows_both_score_formats_and_scores_crafter(tmp_path):
  from bench import signal_plot
  names = [f'a{i:02d}' for i in range(22)]
  ours = tmp_path / 'ours.jsonl'
  with open(ours, 'w') as f:
    for step, score, hit in ((100, 5.0, 0), (950, 1.0, 1), (1000, 3.0, 0)):
      counts = {n: 0 for n in names}
      counts['a00'] = hit
      f.write(json.dumps({'task': 'reward', 'env_step': step, 'score': score,
                          'seed': 0, 'achievements': counts}) + '\n')
  official = tmp_path / 'official.jsonl'
  official.write_text('{"step": 990, "episode/score": 4.0}\n'
                      '{"step": 10, "episode/score": -2.0}\n')
  # The window [1000 - 100, 1000]: episodes at 950 and 1000. One of the two
  # unlocked a00: success 50 % for a00, 0 for the other 21, so the score is
  # exp(log(51) / 22) - 1.
  n, mean, crafter = signal_plot.window_of(str(ours), 100, end=1000)
  assert (n, mean) == (2, 2.0)
  assert abs(crafter - (51 ** (1 / 22) - 1)) < 1e-12
  assert signal_plot.window_of(str(official), 100, end=1000) == (1, 4.0, None)
  # Without an end, the window ends at the run's last episode (990 here).
  assert signal_plot.window_of(str(official), 1000) == (2, 1.0, None)
  out = tmp_path / 'plot.png'
  assert signal_plot.main(['--out', str(out), '--window', '100', '--end', '1000',
                           '--group', 'ours', str(ours),
                           '--group', 'official code', str(official)]) == 0
  assert out.stat().st_size > 0
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('{"t": 1}\n')
  with pytest.raises(ValueError, match='bad.jsonl:1'):
    signal_plot.read(str(bad))


def test_learner_rows_table_and_bad_logs(tmp_path):
  from bench import learner_rows
  row = {'kind': 'train', 'env_step': 10000, 'updates': 1234, 'wall_time': 90.0,
         'train/policy_entropy': 2.8904, 'train/loss/rec_image': 70.4,
         'train/loss/rec_position': 2.2, 'train/loss/rew': 0.214,
         'train/imag_reward_mean': -0.00071, 'train/adv_mag': 0.0123,
         'train/ret_lo': -0.03, 'train/ret_hi': 0.021}
  first = {'kind': 'train', 'env_step': 5000, 'train/policy_entropy': None}
  (tmp_path / 'metrics.jsonl').write_text(
      json.dumps(first) + '\n' + json.dumps({'kind': 'eval'}) + '\n' + json.dumps(row) + '\n')
  out = learner_rows.main(['--logdir', str(tmp_path)]).splitlines()
  # Rows before the first update and non-train rows are left out; the
  # reconstruction loss is the sum of the rec_ terms.
  assert out[2:] == ['| 10K | 1,234 | 2.890 | 73 | 0.21 | -0.0007 | 0.012 '
                     '| [-0.03, 0.02] | 1.5 |']
  assert learner_rows.main(['--logdir', str(tmp_path), '--every', '20000']).count('\n') == 1
  with pytest.raises(SystemExit, match='no such file'):
    learner_rows.main(['--logdir', str(tmp_path / 'none')])
  del row['train/adv_mag']
  (tmp_path / 'metrics.jsonl').write_text(json.dumps(row) + '\n')
  with pytest.raises(SystemExit, match=r"metrics.jsonl:1: a train row without \['train/adv_mag'\]"):
    learner_rows.main(['--logdir', str(tmp_path)])


def _random_policy(*args):
  script = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'bench',
                        'random_policy.py')
  return subprocess.run([sys.executable, script, *args], capture_output=True,
                        text=True, timeout=300)


def test_random_policy_writes_a_runs_score_lines_for_both_pixel_suites(tmp_path):
  # Atari at its repeat of 4: env steps are frames, so every episode ends on a
  # multiple of 4; a Boxing round is 2 minutes of 60 Hz frames, so 8,000
  # frames hold at least one episode.
  done = _random_policy('--suite=atari', '--task=boxing', '--env_steps=8000',
                        f'--logdir={tmp_path / "boxing"}')
  assert done.returncode == 0, done.stderr[-2000:]
  lines = [json.loads(l) for l in open(tmp_path / 'boxing' / 'scores.jsonl')]
  assert lines and all(l['task'] == 'boxing' and l['seed'] == 0 for l in lines)
  assert all(l['env_step'] % 4 == 0 and 7000 <= l['env_step'] <= 8000
             for l in lines)
  # Crafter at repeat 1, with each episode's 22 achievement counts.
  done = _random_policy('--suite=crafter', '--task=reward', '--env_steps=600',
                        '--seed=1', f'--logdir={tmp_path / "crafter"}')
  assert done.returncode == 0, done.stderr[-2000:]
  lines = [json.loads(l) for l in open(tmp_path / 'crafter' / 'scores.jsonl')]
  assert lines and all(l['seed'] == 1 and len(l['achievements']) == 22
                       for l in lines)
  steps = [l['env_step'] for l in lines]
  assert steps == sorted(steps) and steps[-1] <= 600


def test_random_policy_refuses_a_bad_game_before_writing(tmp_path):
  done = _random_policy('--suite=atari', '--task=boxng', '--env_steps=100',
                        f'--logdir={tmp_path / "x"}')
  assert done.returncode != 0 and "Did you mean 'boxing'" in done.stderr
  assert 'Traceback' not in done.stderr and not (tmp_path / 'x').exists()
