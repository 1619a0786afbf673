"""DreamerV3 configuration: one dataclass with every hyperparameter of the spec.

Each field cites where its value comes from: the spec's final hyperparameter
table ("HP table"), an item number ("spec 3.8"), or an open question ("OQ 6").
Where the fidelity rule (DEVELOPERS.md) picks 2411f7d over HEAD (OQ 6, OQ 7),
the field says so and ``docs/deviations.md`` lists it.

Size presets follow spec 2.1: (d, deter, hidden, classes). ``tiny`` is a test
preset that keeps every structural invariant (8 GRU blocks, 32 latents).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from reverb_tables import config as _replay_config


@dataclasses.dataclass(frozen=True)
class SizePreset:
  """Spec 2.1: model dimension d, deter D = 8d, RSSM hidden, classes C = d/16,
  CNN depth d/16 (2.10)."""
  units: int
  deter: int
  hidden: int
  classes: int
  depth: int


# spec 2.1 presets as (d, deter, hidden, classes, CNN depth). size1m is
# code-only (HEAD). tiny's CNN depth is 2, not d/16 = 1: the decoder's spatial
# projection splits the last stage's 4 * depth channels into 8 blocks (2.10).
SIZE_PRESETS = {
    'tiny': SizePreset(units=16, deter=64, hidden=16, classes=4, depth=2),  # tests only
    'size1m': SizePreset(64, 512, 64, 4, 4),
    'size12m': SizePreset(256, 2048, 256, 16, 16),
    'size25m': SizePreset(384, 3072, 384, 24, 24),
    'size50m': SizePreset(512, 4096, 512, 32, 32),
    'size100m': SizePreset(768, 6144, 768, 48, 48),
    'size200m': SizePreset(1024, 8192, 1024, 64, 64),
    'size400m': SizePreset(1536, 12288, 1536, 96, 96),
}

COMPUTE_DTYPES = ('float32', 'bfloat16')


@dataclasses.dataclass(frozen=True)
class DreamerConfig:
  """Every DreamerV3 hyperparameter (spec "Hyperparameter defaults" table)."""

  # --- model size (spec 2.1) -------------------------------------------------
  size: str = 'size12m'           # HP table: paper protocol uses size12m (OQ 1)
  stoch: int = 32                 # S latents, fixed at every size (spec 2.1)
  blocks: int = 8                 # GRU blocks g (spec 2.4)
  enc_layers: int = 3             # spec 2.9
  dec_layers: int = 3             # spec 2.11
  rew_layers: int = 1             # spec 2.12
  con_layers: int = 1             # spec 2.13
  pol_layers: int = 3             # spec 3.15
  val_layers: int = 3             # spec 3.15
  img_layers: int = 2             # RSSM prior MLP (spec 2.5)
  obs_layers: int = 1             # RSSM posterior MLP (spec 2.6)
  unimix: float = 0.01            # latent unimix (spec 1.8)
  actor_unimix: float = 0.01      # discrete actor only (spec 3.14, OQ 5: paper)
  free_nats: float = 1.0          # spec 2.14, after summing over latents
  bins: int = 255                 # two-hot bins (spec 1.9)
  rms_eps: float = 1e-4           # spec 1.3
  # Output-layer scales (spec 1.5).
  outscale_rssm: float = 1.0      # obslogit / priorlogit
  outscale_dec: float = 0.1       # vector decoder: 2411f7d value (OQ 7, docs/deviations.md)
  outscale_rew: float = 0.0       # zero-init reward head (spec 1.5)
  outscale_con: float = 1.0
  outscale_pol: float = 0.01
  outscale_val: float = 0.0       # zero-init critic (spec 1.5)
  outscale_img: float = 1.0       # image decoder 'imgout' (spec 1.5, 2.10; HEAD and 2411f7d)

  # --- world-model / actor-critic losses (spec 4.1) ----------------------------
  loss_rec: float = 1.0           # per obs key
  loss_rew: float = 1.0
  loss_con: float = 1.0
  loss_dyn: float = 1.0
  loss_rep: float = 0.1
  loss_policy: float = 1.0
  loss_value: float = 1.0
  loss_repval: float = 0.3
  imag_horizon: int = 15          # H (spec 3.2)
  horizon: int = 333              # 1 / (1 - gamma) (spec 3.6)
  contdisc: bool = True           # continue target 0.997 (1 - term) (spec 2.13)
  lam: float = 0.95               # imagination lambda (spec 3.7)
  replay_lam: float = 0.95        # replay lambda (spec 3.19)
  actent: float = 3e-4            # entropy scale eta (spec 3.12)
  slowreg: float = 1.0            # slow-critic regulariser (spec 3.17)
  slow_rate: float = 0.02         # slow critic EMA rate (spec 3.18)
  retnorm_rate: float = 0.01      # spec 3.8
  retnorm_limit: float = 1.0
  retnorm_perclo: float = 5.0
  retnorm_perchi: float = 95.0
  # OQ 6 (docs/deviations.md): imagination start reward/continuation from the
  # replayed data (reward_t, 1 - is_terminal_t), as 2411f7d. False = HEAD.
  start_from_data: bool = True
  minstd: float = 0.1             # bounded normal policy (spec 3.13)
  maxstd: float = 1.0

  # --- optimizer (spec 4.3-4.7, Algorithm I) -----------------------------------
  lr: float = 4e-5
  warmup: int = 1000
  agc: float = 0.3
  agc_pmin: float = 1e-3
  beta1: float = 0.9
  beta2: float = 0.999            # OQ 2: code value (paper text says 0.99)
  eps: float = 1e-20

  # --- replay (spec 5) ----------------------------------------------------------
  batch_size: int = 16            # B (Table 4)
  batch_length: int = 64          # T trained steps (Table 4)
  replay_context: int = 1         # spec 5.8 (the only supported value)
  replay_capacity: int = int(5e6)  # items (spec 5.1)
  online_queue: bool = True       # spec 5.4
  # Stored deter dtype: bf16 halves memory; lossless when compute is bf16,
  # a rounding of the context state when compute is f32 (docs/deviations.md).
  latent_store_dtype: str = 'bfloat16'

  # --- loop (spec 6) --------------------------------------------------------------
  train_ratio: float = 512.0      # Table 2 proprio (OQ 1)
  train_fill: int = 1024          # gate in items = B*T (spec 6.2)
  seed: int = 0

  # --- numerics (spec 1.12, OQ 10) -------------------------------------------
  compute_dtype: str = 'float32'  # f32 on CPU by default; 'bfloat16' for GPU

  # lax.scan unroll factor for the RSSM scans (1 = rolled loop; 0 = fully
  # unrolled, used by bench/learner.py to count FLOPs with XLA's cost analysis,
  # which counts a while-loop body once). Performance knob, not algorithmic.
  scan_unroll: int = 1

  # Explicit overrides of the preset (None = take from `size`).
  units_override: Optional[int] = None

  def __post_init__(self):
    if self.size not in SIZE_PRESETS:
      raise ValueError(
          f'Unknown size preset {self.size!r}; valid: {sorted(SIZE_PRESETS)}')
    if self.compute_dtype not in COMPUTE_DTYPES:
      raise ValueError(f'compute_dtype must be one of {COMPUTE_DTYPES}, '
                       f'got {self.compute_dtype!r}')
    if self.replay_context != 1:
      raise ValueError('Only replay_context=1 is implemented (spec 5.8).')
    for name in ('imag_horizon', 'bins'):
      if getattr(self, name) <= 0:
        raise ValueError(f'{name} must be positive, got {getattr(self, name)}')
    if self.bins % 2 != 1:
      raise ValueError(f'bins must be odd (symmetric two-hot), got {self.bins}')
    p = self.preset
    if p.deter % self.blocks or (3 * p.deter) % self.blocks:
      raise ValueError(f'deter {p.deter} not divisible by blocks {self.blocks}')
    if self.classes > 256:
      raise ValueError('classes > 256 cannot be stored as uint8 indices')
    # The replay's rules (batch sizes, train ratio, capacity, latent dtype)
    # have one home, the replay's own config (spec 5, 6.1).
    _replay_config.ReplayConfig.of(self)

  # --- derived sizes ----------------------------------------------------------
  @property
  def preset(self) -> SizePreset:
    return SIZE_PRESETS[self.size]

  @property
  def units(self) -> int:
    return self.units_override or self.preset.units

  @property
  def deter(self) -> int:
    return self.preset.deter

  @property
  def hidden(self) -> int:
    return self.preset.hidden

  @property
  def classes(self) -> int:
    return self.preset.classes

  @property
  def cnn_depth(self) -> int:
    """CNN depth of the preset (spec 2.1 table, 2.10): d/16, 16 at size12m."""
    return self.preset.depth

  @property
  def feat_dim(self) -> int:
    """Feature width deter + S*C (spec 2.1): 2560 at size12m."""
    return self.deter + self.stoch * self.classes

  @property
  def seq_len(self) -> int:
    """Replay item length T + context = 65 (spec 5.1)."""
    return self.batch_length + self.replay_context

  @property
  def batch_steps(self) -> int:
    """B*T, the denominator of the train ratio (spec 6.1)."""
    return self.batch_size * self.batch_length

  @property
  def gamma(self) -> float:
    return 1.0 - 1.0 / self.horizon

  @property
  def jnp_compute_dtype(self):
    import jax.numpy as jnp
    return jnp.bfloat16 if self.compute_dtype == 'bfloat16' else jnp.float32

  def unroll_for(self, length: int) -> int:
    return length if self.scan_unroll == 0 else max(1, min(self.scan_unroll, length))

  def replace(self, **kwargs) -> 'DreamerConfig':
    return dataclasses.replace(self, **kwargs)


def make_config(**overrides) -> DreamerConfig:
  """Builds a config, rejecting unknown names with a clear error."""
  names = {f.name for f in dataclasses.fields(DreamerConfig)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise ValueError(f'Unknown config field(s) {unknown}; valid: {sorted(names)}')
  return DreamerConfig(**overrides)


def latent_store_np_dtype(config: DreamerConfig):
  """Numpy dtype for stored deter: uint16 bf16 bit patterns or float32.

  Kept for existing callers; the logic lives in ``reverb_tables.config``
  (numpy only, imports no TensorFlow or Reverb).
  """
  return _replay_config.latent_store_np_dtype(config)
