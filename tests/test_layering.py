"""One-way layering: agent/ may import reverb_tables/, never the reverse.

(a) importing every reverb_tables module in a fresh interpreter loads no
``agent`` module; (b) no file in reverb_tables/ has an ``import agent`` /
``from agent... import`` statement anywhere (module level, functions,
TYPE_CHECKING blocks). Also checks ``ReplayConfig.of`` on a DreamerConfig.
"""

import ast
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'reverb_tables'
# Every module of the package (new ones are picked up automatically).
MODULES = sorted(p.stem for p in PACKAGE.glob('*.py') if p.stem != '__init__')


def test_modules_found():
  assert {'config', 'tables', 'adder', 'sampler', 'latent_store',
          'checkpoint', 'packing'} <= set(MODULES), MODULES


def test_importing_reverb_tables_loads_no_agent_module():
  code = '\n'.join(
      ['import sys'] +
      [f'import reverb_tables.{m}' for m in MODULES] +
      ["bad = sorted(m for m in sys.modules",
       "             if m == 'agent' or m.startswith('agent.'))",
       "assert not bad, bad",
       "print('OK')"])
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [str(ROOT)] + [p for p in [env.get('PYTHONPATH')] if p])
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout.strip().endswith('OK')


def _agent_imports(path: pathlib.Path):
  tree = ast.parse(path.read_text(), filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:            # relative import: stays inside reverb_tables
        continue
      names = [node.module or '']
    else:
      continue
    for name in names:
      if name == 'agent' or name.startswith('agent.'):
        yield f'{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}'


def test_no_file_in_reverb_tables_imports_agent():
  files = sorted(PACKAGE.rglob('*.py'))
  assert files
  found = [hit for f in files for hit in _agent_imports(f)]
  assert not found, found


def test_replay_config_of_dreamer_config():
  from agent.config import make_config
  from reverb_tables.config import ReplayConfig, latent_store_np_dtype
  dreamer = make_config(size='tiny', batch_size=2, batch_length=8,
                        replay_capacity=1000, train_fill=16,
                        latent_store_dtype='float32')
  replay = ReplayConfig.of(dreamer)
  assert ReplayConfig.of(replay) is replay
  for field in ('seq_len', 'batch_size', 'batch_length', 'replay_capacity',
                'online_queue', 'train_ratio', 'train_fill', 'batch_steps',
                'deter', 'stoch', 'latent_store_dtype', 'seed'):
    assert getattr(replay, field) == getattr(dreamer, field), field
  assert replay.seq_len == 9 and replay.batch_steps == 16
  assert latent_store_np_dtype(replay) == np.float32
  assert latent_store_np_dtype('bfloat16') == np.uint16
  with pytest.raises(ValueError, match='latent_store_dtype'):
    latent_store_np_dtype('float16')


def test_replay_config_of_rejects_incomplete_object():
  from reverb_tables.config import ReplayConfig

  class Partial:
    seq_len = 65
    batch_size = 16

  with pytest.raises(TypeError, match='batch_length'):
    ReplayConfig.of(Partial())


def test_replay_config_imports_no_heavy_framework():
  """agent.config imports reverb_tables.config, so it must stay numpy-only."""
  code = ('import sys, reverb_tables.config\n'
          "heavy = [m for m in ('tensorflow', 'reverb', 'jax', 'acme', 'agent')"
          ' if m in sys.modules]\n'
          'assert not heavy, heavy\n')
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr
