"""Times the OFFICIAL DreamerV3 train step (danijar/dreamerv3, the 2025 JAX
layout) on the same synthetic walker-like vector task as bench/learner.py, so
the two can be measured side by side in one sitting (issue: learner speed).

Only the agent's train step runs: no env, driver, replay or logger. Settings
as bench/learner.py: B=16, T=64 (+1 replay-context step), float32, CPU.

Setup, in a venv of its own (the official code is not a dependency):
  python3.10 -m venv /tmp/official/venv
  /tmp/official/venv/bin/pip install "jax[cpu]==0.6.2" numpy==1.26.4 chex==0.1.90 \
      optax==0.2.8 einops==0.8.2 ninjax==3.6.3 elements==3.22.4 portal==3.8.3 \
      ruamel.yaml==0.19.1 cloudpickle==3.1.3
  (for bench/parity.py, which trains it on DMC, also
      /tmp/official/venv/bin/pip install -c requirements.lock \
          dm-control==1.0.50 mujoco==3.17.0
   the constraint file keeps pip's resolver from backtracking for minutes)
  and a checkout of github.com/danijar/dreamerv3 (measured: commit f8817c4,
  unmodified) at --src.
Run:
  /tmp/official/venv/bin/python bench/official.py --src=/tmp/official/src \
      --size=size1m --updates=15 [extra official flags...]

Extra arguments go to the official config parser (elements.Flags). Each timed
call is `agent.train(carry, batch)` end to end, blocking on its results (it
also waits for the previous step's metrics and copies the policy weights, as
the official training loop does).
"""

import argparse
import os
import pathlib
import re
import statistics
import sys
import time

SRC = None
LOGDIR = pathlib.Path('/tmp/official_bench_logdir')


def parse():
  p = argparse.ArgumentParser()
  p.add_argument('--src', default=os.environ.get('DREAMERV3_SRC', ''),
                 help='checkout of danijar/dreamerv3 (has dreamerv3/ and embodied/)')
  p.add_argument('--size', default='size1m', choices=[
      'size1m', 'size12m', 'size25m', 'size50m', 'size100m', 'size200m',
      'size400m'])
  p.add_argument('--updates', type=int, default=10)
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--obs_dim', type=int, default=24)
  p.add_argument('--image', type=int, default=0,
                 help="1: one 64x64x3 uint8 'image' observation (DMC vision, "
                      'the CNN) instead of the vector')
  p.add_argument('--act_dim', type=int, default=6)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--precompile', type=int, default=0,
                 help='1: let the official Agent AOT-compile train and '
                      'report in its constructor (its default); 0: compile '
                      'train lazily on the first call so compile_s is the '
                      'first call')
  return p.parse_known_args()


def build_config(size, other):
  import elements
  import ruamel.yaml as yaml
  # Same steps as dreamerv3/main.py:main().
  configs = yaml.YAML(typ='safe').load(
      (SRC / 'dreamerv3' / 'configs.yaml').read_text())
  config = elements.Config(configs['defaults'])
  config = config.update(configs[size])
  # Benchmark settings (all are existing official config keys).
  config = config.update({
      'jax.platform': 'cpu',
      'jax.compute_dtype': 'float32',
      'jax.prealloc': False,
      'batch_size': 16,
      'batch_length': 64,
      'logdir': str(LOGDIR),
  })
  config = elements.Flags(config).parse(other)
  return config


def make_agent(config, obs_dim, act_dim, precompile, image=False):
  import elements
  import numpy as np
  from dreamerv3.agent import Agent
  obs_space = {
      **({'image': elements.Space(np.uint8, (64, 64, 3))} if image else
         {'vector': elements.Space(np.float32, (obs_dim,))}),
      'reward': elements.Space(np.float32),
      'is_first': elements.Space(bool),
      'is_last': elements.Space(bool),
      'is_terminal': elements.Space(bool),
  }
  act_space = {
      'action': elements.Space(np.float32, (act_dim,), -1.0, 1.0),
  }
  # Same as dreamerv3/main.py:make_agent(), plus two embodied.jax.agent
  # Options (not in configs.yaml): the JAX profiler (which would start a
  # trace at update 100) is turned off, and precompile is selectable.
  jaxcfg = dict(config.jax)
  jaxcfg['profiler'] = False
  jaxcfg['precompile'] = bool(precompile)
  return Agent(obs_space, act_space, elements.Config(
      **config.agent,
      logdir=config.logdir,
      seed=config.seed,
      jax=jaxcfg,
      batch_size=config.batch_size,
      batch_length=config.batch_length,
      replay_context=config.replay_context,
      report_length=config.report_length,
      replica=config.replica,
      replicas=config.replicas,
  ))


def synthetic_batch(agent, B, T, rng):
  import numpy as np
  data = {}
  for key, space in agent.spaces.items():
    shape = (B, T, *space.shape)
    if key == 'vector':
      data[key] = rng.standard_normal(shape).astype(np.float32)
    elif key == 'image':
      data[key] = rng.integers(0, 256, shape, dtype=np.uint8)
    elif key == 'action':
      data[key] = rng.uniform(-1, 1, shape).astype(np.float32)
    elif key == 'reward':
      data[key] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    elif key == 'is_first':
      x = np.zeros(shape, bool)
      x[:, 0] = True
      data[key] = x
    elif key in ('is_last', 'is_terminal'):
      x = rng.random(shape) < 0.002
      data[key] = x
    elif key == 'consec':
      data[key] = np.zeros(shape, np.int32)
    elif key == 'stepid':
      data[key] = rng.integers(0, 255, shape).astype(np.uint8)
    elif key.endswith('/stoch'):
      classes = shape[-1]
      idx = rng.integers(0, classes, shape[:-1])
      data[key] = np.eye(classes, dtype=np.float32)[idx]
    elif key.endswith('/deter'):
      data[key] = np.tanh(rng.standard_normal(shape)).astype(np.float32)
    else:
      assert np.issubdtype(space.dtype, np.floating), (key, space)
      data[key] = rng.standard_normal(shape).astype(space.dtype)
    assert data[key].dtype == space.dtype, (key, data[key].dtype, space)
  return data


def main():
  global SRC
  args, other = parse()
  SRC = pathlib.Path(args.src)
  if not (SRC / 'dreamerv3' / 'configs.yaml').exists():
    sys.exit(f'--src={args.src!r} is not a dreamerv3 checkout (no dreamerv3/configs.yaml)')
  sys.path.insert(0, str(SRC))
  config = build_config(args.size, other)

  t0 = time.perf_counter()
  agent = make_agent(config, args.obs_dim, args.act_dim, args.precompile,
                     bool(args.image))
  init_s = time.perf_counter() - t0

  import jax
  import numpy as np
  from embodied.jax import internal

  B = config.batch_size
  T = config.batch_length + config.replay_context
  rng = np.random.default_rng(args.seed)
  host = synthetic_batch(agent, B, T, rng)
  # Explicit transfer, as Agent.stream() does (transfer guard is 'disallow').
  data = internal.device_put(host, agent.train_sharded)
  jax.block_until_ready(data)
  # agent.params holds all agent state: module weights, optimizer moments,
  # the slow value copy and normalizer stats. 'trainable' are the weights of
  # the modules the official optimizer updates (as in its summary printout).
  size = lambda v: int(np.prod(v.shape))
  nstate = sum(size(v) for v in agent.params.values())
  istrain = re.compile(r'^(dyn|enc|dec|rew|con|pol|val)/').match
  ntrain = sum(size(v) for k, v in agent.params.items() if istrain(k))

  carry = agent.init_train(B)
  counter = [0]

  def step(carry):
    seed = agent._seeds(counter[0], agent.train_mirrored)
    counter[0] += 1
    carry, outs, mets = agent.train(carry, {**data, 'seed': seed})
    jax.block_until_ready((agent.params, carry))
    return carry, mets

  t0 = time.perf_counter()
  carry, _ = step(carry)
  compile_s = time.perf_counter() - t0

  for _ in range(args.warmup):
    carry, _ = step(carry)

  times = []
  for _ in range(args.updates):
    t0 = time.perf_counter()
    carry, mets = step(carry)
    times.append(time.perf_counter() - t0)

  loss = mets.get('opt/loss', float('nan')) if mets else float('nan')
  print(
      f'official size={args.size} '
      f'update_s_median={statistics.median(times):.4f} '
      f'min={min(times):.4f} max={max(times):.4f} n={len(times)} '
      f'compile_s={compile_s:.2f} init_s={init_s:.2f} '
      f'trainable_params={ntrain} state_params={nstate} '
      f'B={B} T={config.batch_length} '
      f'dtype={config.jax.compute_dtype} platform={jax.default_backend()} '
      f'loss={float(loss):.4f}', flush=True)


if __name__ == '__main__':
  main()
