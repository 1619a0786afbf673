"""A tree of arrays (the learner's ``TrainingState``) in an .npz, no pickle.

``save_tree`` writes every leaf as an array of the .npz (``leaf_<i>``) and a
JSON ``meta`` entry with each leaf's key path (``jax.tree_util.keystr``)
and dtype name. ``load_tree`` reads it with ``np.load(allow_pickle=False)``
into the structure of a ``template`` (a tree of the same paths, e.g.
``jax.eval_shape`` of the learner's init), checking every path, shape and
dtype first: a checkpoint is data, never code, and one of another model or
env is refused by name. The file must be private to this user
(``private_files.check_private``).

Why not Orbax: it is not part of the pinned stack, and one .npz next to the
checkpoint's other files is all a resume needs.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from experiments.run.private_files import check_private

META = 'meta'


def _dtype(name: str) -> np.dtype:
  if name == 'bfloat16':
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)
  return np.dtype(name)


def save_tree(file, tree: Any) -> None:
  """Writes ``tree``'s leaves and key paths to ``file`` (a path or an open
  binary file; the caller makes it atomic)."""
  import jax
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  arrays = [np.asarray(x) for _, x in leaves]
  meta = {'paths': [jax.tree_util.keystr(p) for p, _ in leaves],
          'dtypes': [a.dtype.name for a in arrays]}
  np.savez(file, **{META: np.asarray(json.dumps(meta))},
           **{f'leaf_{i}': (a.view(np.uint16) if a.dtype.name == 'bfloat16'
                            else a) for i, a in enumerate(arrays)})


def load_tree(path: str, template: Any) -> Any:
  """The tree ``save_tree`` wrote, in ``template``'s structure; ValueError
  naming the first path, shape or dtype that differs."""
  import jax
  check_private(path)
  t_leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
  with np.load(path, allow_pickle=False) as data:
    meta = json.loads(str(data[META]))
    paths, dtypes = meta['paths'], meta['dtypes']
    want = [jax.tree_util.keystr(p) for p, _ in t_leaves]
    if paths != want:
      diff = next((f'{a} != {b}' for a, b in zip(paths, want) if a != b),
                  f'{len(paths)} leaves saved, {len(want)} expected')
      raise ValueError(f'{path} holds another structure than this learner '
                       f'(different model size or env?): {diff}')
    out = []
    for i, ((p, t), name) in enumerate(zip(t_leaves, dtypes)):
      x = np.asarray(data[f'leaf_{i}'])
      dtype = _dtype(name)
      if dtype.name == 'bfloat16':
        x = x.view(dtype)
      if x.shape != tuple(t.shape) or x.dtype != np.dtype(t.dtype):
        raise ValueError(f'{path}: {jax.tree_util.keystr(p)} is '
                         f'{x.dtype}{list(x.shape)}, this learner has '
                         f'{np.dtype(t.dtype)}{list(t.shape)}')
      out.append(x)
  return jax.tree_util.tree_unflatten(treedef, out)
