"""experiments/ imports point one way: envs -> run -> layouts -> entry points,
and tools -> run, envs (agent/ and reverb_tables/ are guarded by
tests/test_layering.py).

Every import statement counts, module level or inside a function, so a cycle
cannot hide behind a function-level import. Also: no module imports an
underscore name of another module. And no file, class or function in
experiments/ grows past its room size.
"""

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'experiments'
# Layer of each package (the entry points are experiments/*.py).
LAYERS = {'envs': 0, 'run': 1, 'layouts': 2, 'tools': 2, 'entry': 3}
# Who may import whom besides the layer order: tools never import layouts.
FORBIDDEN = {('tools', 'layouts'), ('layouts', 'tools')}


def _module(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix('').parts)
  if parts[-1] == '__init__':
    parts = parts[:-1]
  return '.'.join(parts)


MODULES = {_module(p): p for p in PACKAGE.rglob('*.py')}


def _layer(module: str) -> str:
  parts = module.split('.')
  return parts[1] if len(parts) > 2 or parts[1] in LAYERS else 'entry'


def _imports(module: str):
  """(imported experiments module, imported name or None, line) per import."""
  path = MODULES[module]
  tree = ast.parse(path.read_text(), filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name in MODULES:
          yield alias.name, None, node.lineno
    elif isinstance(node, ast.ImportFrom):
      assert not node.level, f'{path}:{node.lineno}: use absolute imports'
      base = node.module or ''
      for alias in node.names:
        full = f'{base}.{alias.name}'
        if full in MODULES:
          yield full, None, node.lineno
        elif base in MODULES:
          yield base, alias.name, node.lineno


def _graph():
  graph = collections.defaultdict(set)
  for module in MODULES:
    for target, _, _ in _imports(module):
      if target != module:
        graph[module].add(target)
  return graph


def test_packages_found():
  packages = {_layer(m) for m in MODULES if m != 'experiments'}
  assert packages == set(LAYERS), packages


def test_no_import_cycles():
  graph = _graph()
  state, stack, cycles = {}, [], []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 'open':
        cycles.append(stack[stack.index(nxt):] + [nxt])
      elif nxt not in state:
        visit(nxt)
    stack.pop()
    state[node] = 'done'

  for module in sorted(MODULES):
    if module not in state:
      visit(module)
  assert not cycles, cycles


def test_imports_point_down_the_layers():
  bad = []
  for module in MODULES:
    src = _layer(module) if module != 'experiments' else 'entry'
    for target, _, line in _imports(module):
      dst = _layer(target) if target != 'experiments' else 'entry'
      if src == dst:
        continue
      if LAYERS[dst] >= LAYERS[src] or (src, dst) in FORBIDDEN:
        bad.append(f'{module}:{line} ({src}) imports {target} ({dst})')
  assert not bad, bad


def test_no_underscore_names_across_modules():
  bad = [f'{module}:{line} imports {target}.{name}'
         for module in MODULES for target, name, line in _imports(module)
         if name and name.startswith('_') and not name.startswith('__')]
  assert not bad, bad


def test_agent_and_reverb_tables_never_import_experiments():
  bad = []
  for folder in ('agent', 'reverb_tables'):
    for path in (ROOT / folder).rglob('*.py'):
      tree = ast.parse(path.read_text())
      for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ''] if isinstance(node, ast.ImportFrom)
                 else [])
        bad += [f'{path.relative_to(ROOT)}:{node.lineno}' for n in names
                if n == 'experiments' or n.startswith('experiments.')]
  assert not bad, bad


# Room sizes in experiments/: past these a file, class or function has
# taken on a second job, and is split rather than stretched.
MAX_FILE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 450, 200, 80


def test_rooms_stay_small():
  bad = []
  for module, path in MODULES.items():
    src = path.read_text()
    if src.count('\n') > MAX_FILE_LINES:
      bad.append(f'{path.relative_to(ROOT)}: {src.count(chr(10))} lines')
    for node in ast.walk(ast.parse(src)):
      limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else
               MAX_FUNCTION_LINES if isinstance(
                   node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
      lines = limit and node.end_lineno - node.lineno + 1
      if limit and lines > limit:
        bad.append(f'{module}:{node.lineno} {node.name}: {lines} lines '
                   f'(at most {limit})')
  assert not bad, bad
