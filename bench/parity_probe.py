"""Ours' training run with position-resolved world-model losses.

  python bench/parity_probe.py <experiments/run_dmc.py flags...>

Runs experiments/run_dmc.py unchanged in this process after wrapping
`agent.learning.compute_losses` to add, per update, the mean of each
world-model loss (dyn, rew, con and every rec_<key>) over groups of trained
window positions: `pos/<loss>/<group>` (POS_GROUPS; t0 is the first trained
step after the replay context, spec 5.8), and what the batch holds: `data/<key>`
means of each observation key, the reward, is_first and |a_{t-1}| over the
trained steps. Extra metrics only: the losses,
gradients and updates are the same functions of the same inputs.
bench/parity_official.py adds the same metrics to the official run, so
`bench/parity.py run --side=ours --probe` and the official side can be
compared position by position (a fault at the window start, e.g. in the
replay-context latents, shows at t0-t3 only).
"""

from __future__ import annotations

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Position groups of the trained window; bench/parity_official.py imports them too.
POS_GROUPS = (('t0', 0, 1), ('t1', 1, 2), ('t2-3', 2, 4), ('t4-7', 4, 8),
              ('t8-15', 8, 16), ('t16-31', 16, 32))


def position_metrics(losses, keys):
  """{'pos/<key>/<group>': mean of losses[key][:, a:b]} for [B, T] losses."""
  out = {}
  for key in keys:
    value = losses[key]
    for name, a, b in POS_GROUPS:
      if a < value.shape[1]:
        out[f'pos/{key}/{name}'] = value[:, a:b].mean()
  return out


def data_metrics(obs, reward, is_first, prevact):
  """What the trained steps of a batch hold: `data/<key>` means
  of each observation key, of the reward, of is_first and of |a_{t-1}|."""
  out = {f'data/{k}': v.mean() for k, v in obs.items()}
  out['data/reward'] = reward.mean()
  out['data/is_first'] = is_first.astype('float32').mean()
  out['data/action_abs'] = abs(prevact).mean()
  return out


def install() -> None:
  """Wraps agent.learning.compute_losses (looked up by loss_fn at trace time)."""
  from agent import learning
  compute = learning.compute_losses

  def probed(params, slow_params, retnorm, batch, key, nets):
    losses, (retnorm, metrics, outs) = compute(params, slow_params, retnorm, batch,
                                               key, nets)
    T = batch['is_first'].shape[1] - 1
    keys = [k for k, v in losses.items()
            if (k in ('dyn', 'rew', 'con') or k.startswith('rec_'))
            and v.shape[1:] == (T,)]
    data = data_metrics({k: v[:, 1:] for k, v in batch['observation'].items()},
                        batch['reward'][:, 1:], batch['is_first'][:, 1:],
                        batch['action'][:, :-1])
    return losses, (retnorm, {**metrics, **position_metrics(losses, keys), **data},
                    outs)

  learning.compute_losses = probed


def main() -> None:
  sys.path.insert(0, ROOT)
  install()
  script = os.path.join(ROOT, 'experiments', 'run_dmc.py')
  sys.argv = [script] + sys.argv[1:]
  runpy.run_path(script, run_name='__main__')


if __name__ == '__main__':
  main()
