"""The jaxgrpo package imports without cycles, and each layer only downwards.

Every module under jaxgrpo/ is parsed with `ast` (nothing is imported) and
each import of a jaxgrpo module becomes an edge of a graph: at module level
or inside a function, `import jaxgrpo.x`, `from jaxgrpo import x`,
`from jaxgrpo.x import y`, relative imports, and `importlib.import_module` /
`__import__` with a literal name (imports under `if TYPE_CHECKING:` too).
`from P import name` is an edge to the module P.name when there is one,
else to P. A module's own package `__init__` is not counted as imported by
it (Python runs it first anyway). The test fails naming a cycle, as
`a -> b -> ... -> a`, in each group of modules that import each other.
"""

import ast
import os
import textwrap

from absl.testing import absltest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = 'jaxgrpo'


def modules(root: str, package: str) -> dict[str, str]:
  """Dotted module name -> file, for every .py file of `package` under
  `root` (a package is named by its __init__.py)."""
  found = {}
  for folder, dirs, files in os.walk(os.path.join(root, package)):
    dirs[:] = sorted(d for d in dirs if not d.startswith(('.', '__pycache__')))
    for name in sorted(files):
      if not name.endswith('.py'):
        continue
      path = os.path.join(folder, name)
      parts = os.path.relpath(path, root)[:-len('.py')].split(os.sep)
      if parts[-1] == '__init__':
        parts.pop()
      found['.'.join(parts)] = path
  return found


def _literal_import(node: ast.Call) -> str | None:
  """The name in `importlib.import_module('a.b')` / `__import__('a.b')`."""
  func = node.func
  name = (func.attr if isinstance(func, ast.Attribute)
          else func.id if isinstance(func, ast.Name) else None)
  if name not in ('import_module', '__import__') or not node.args:
    return None
  arg = node.args[0]
  if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
    return arg.value
  return None


def imports_of(module: str, path: str, known: set[str],
               package: str) -> set[str]:
  """The modules of `known` that `module` (the file `path`) imports."""

  def resolve(name: str) -> str | None:
    """The longest prefix of `name` that is a known module."""
    while name and name not in known:
      name = name.rpartition('.')[0]
    return name or None

  def inside(name: str) -> bool:
    return name == package or name.startswith(package + '.')

  is_package = os.path.basename(path) == '__init__.py'
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), filename=path)
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(resolve(a.name) for a in node.names if inside(a.name))
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = module.split('.')
        if not is_package:
          base.pop()
        base = base[:len(base) - (node.level - 1)]
        source = '.'.join(base + ([node.module] if node.module else []))
      else:
        source = node.module or ''
      if not inside(source):
        continue
      for alias in node.names:
        submodule = f'{source}.{alias.name}'
        found.add(submodule if submodule in known else resolve(source))
    elif isinstance(node, ast.Call):
      name = _literal_import(node)
      if name is not None and inside(name):
        found.add(resolve(name))
  found.discard(None)
  found.discard(module)
  return found


def import_graph(root: str, package: str) -> dict[str, set[str]]:
  """Module -> the package's modules it imports (see the module docstring)."""
  files = modules(root, package)
  known = set(files)
  return {m: imports_of(m, p, known, package) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle [a, b, ..., a] through each strongly connected group of
  modules (Tarjan's algorithm, then the shortest way back to the group's
  first module)."""
  index, low, stack, on_stack, groups = {}, {}, [], set(), []

  def connect(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        connect(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = set()
      while True:
        w = stack.pop()
        on_stack.discard(w)
        group.add(w)
        if w == v:
          break
      if len(group) > 1:
        groups.append(group)

  for v in sorted(graph):
    if v not in index:
      connect(v)

  found = []
  for group in groups:
    start = min(group)
    paths, seen = [[start]], {start}
    while paths:  # breadth first: the shortest cycle through `start`
      path = paths.pop(0)
      nexts = sorted(graph[path[-1]] & group)
      if start in nexts:
        found.append(path + [start])
        break
      for w in nexts:
        if w not in seen:
          seen.add(w)
          paths.append(path + [w])
  return sorted(found)


def describe(found: list[list[str]]) -> str:
  return '\n'.join(' -> '.join(cycle) for cycle in found)


class LayoutTest(absltest.TestCase):

  def test_no_import_cycles(self):
    graph = import_graph(REPO, PACKAGE)
    found = cycles(graph)
    self.assertEmpty(found, f'import cycles in {PACKAGE}/ (break each one, '
                     f'e.g. by moving what both sides need into a module '
                     f'lower down):\n{describe(found)}')

  def test_the_graph_holds_known_imports(self):
    """Guards the test above against a graph that misses imports."""
    graph = import_graph(REPO, PACKAGE)
    self.assertIn('jaxgrpo.train', graph)
    self.assertIn('jaxgrpo.verifiers', graph)  # a package's __init__
    self.assertIn('jaxgrpo.reporting.tensorboard',
                  graph['jaxgrpo.reporting.metrics'])
    self.assertIn('jaxgrpo.records', graph['jaxgrpo.reporting.tensorboard'])
    # Inside a function.
    self.assertIn('jaxgrpo.reporting.metrics',
                  graph['jaxgrpo.reporting.plot_panels'])
    # importlib.import_module with a literal name.
    self.assertIn('jaxgrpo.data.tfds_builders', graph['jaxgrpo.data.sources'])
    self.assertIn('jaxgrpo.verifiers.exact', graph['jaxgrpo.verifiers'])


# The layers, lowest first: a module may import its own layer and those
# below it. A name is a top-level module or package of jaxgrpo.
LAYERS = (
    # Shared types and helpers.
    ('base', {'errors', 'example', 'typing', 'checks', 'records', 'sharding',
              'multihost', 'integrity'}),
    # The decoder and its weights; what a run shows, from its metrics.
    ('model', {'model', 'reporting'}),
    ('generate', {'generate'}),
    # Prompts, datasets and their rewards.
    ('data', {'data', 'verifiers'}),
    ('rl', {'rl', 'scoring'}),
    # A run: its config, parts, loop and checkpoints; tools built on them.
    ('train', {'config_lib', 'config_doc', 'build', 'checkpoint',
               'orbax_patch', 'evaluate', 'optimizer', 'preemption', 'train',
               'train_state', 'train_step', 'warmstart', 'model_spec', 'sim', 'stratify',
               'resume', 'resume_policy', 'workdir'}),
    # The commands, and the experiment configs users start from.
    ('cli', {'cli', 'main', 'configs'}),
)
# Imports against the layers, each with its reason.
LAYER_EXCEPTIONS = {
    # A pretrained model comes with its own tokenizer.
    ('jaxgrpo.model.pretrained', 'jaxgrpo.data.hf_tokenizer'),
    # Datasets are built from their config entries.
    ('jaxgrpo.data.loading', 'jaxgrpo.config_lib'),
    # A curriculum reads the strata tables that jaxgrpo-stratify writes.
    ('jaxgrpo.data.curriculum', 'jaxgrpo.stratify.bands'),
    ('jaxgrpo.data.curriculum', 'jaxgrpo.stratify.passrates'),
    # `python -m jaxgrpo.stratify` runs the jaxgrpo-stratify command.
    ('jaxgrpo.stratify.__main__', 'jaxgrpo.cli.stratify'),
}


def layer_of(module: str) -> int:
  name = module.split('.')[1] if '.' in module else ''
  for i, (_, names) in enumerate(LAYERS):
    if name in names:
      return i
  raise KeyError(f'{module} is in no layer of LAYERS')


class LayersTest(absltest.TestCase):

  def test_modules_import_only_their_layer_and_those_below(self):
    graph = import_graph(REPO, PACKAGE)
    upward = sorted(
        f'{m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})'
        for m, deps in graph.items() if m != PACKAGE
        for d in deps
        if layer_of(d) > layer_of(m) and (m, d) not in LAYER_EXCEPTIONS)
    self.assertEmpty(upward, 'imports of a higher layer (move the code '
                     'down, or pass what it needs in):\n' + '\n'.join(upward))

  def test_the_readme_layout_names_every_module_and_package(self):
    with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
      text = f.read()
    block = text.split('\n## Layout', 1)[1].split('\n## ', 1)[0]
    missing = [name for _, names in LAYERS for name in sorted(names)
               if f'{name}.py' not in block and f'{name}/' not in block]
    self.assertEmpty(missing, "README.md's Layout names neither NAME.py nor "
                     'NAME/ for these')

  def test_every_exception_is_still_needed(self):
    graph = import_graph(REPO, PACKAGE)
    stale = [e for e in LAYER_EXCEPTIONS if e[1] not in graph.get(e[0], ())]
    self.assertEmpty(stale, 'LAYER_EXCEPTIONS no longer imported')


class GraphTest(absltest.TestCase):
  """The graph and the cycle search on a made-up package `pkg`."""

  def _package(self, files: dict[str, str]) -> str:
    root = self.create_tempdir().full_path
    for name, text in files.items():
      path = os.path.join(root, 'pkg', name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w', encoding='utf-8') as f:
        f.write(textwrap.dedent(text))
    return root

  def test_every_import_form(self):
    root = self._package({
        '__init__.py': '',
        'a.py': """
            import os
            import pkg.b
            from pkg import c
            from pkg.sub.d import helper
            from pkg.sub import e as e_lib, CONSTANT
            import numpy as np

            def later():
              from . import f
              import importlib
              importlib.import_module('pkg.g')
              __import__('pkg.sub.h')
              importlib.import_module(os.environ['NOT_A_LITERAL'])
        """,
        'b.py': 'import pkg\nfrom pkg.c import thing\nimport pkg.c.x\n',
        'c.py': 'from .a import later\n',
        'f.py': 'from pkg import *\n',
        'g.py': '', 'sub/h.py': '',
        'sub/__init__.py': 'from . import e\nfrom .d import helper\n'
                           'from .. import g\nCONSTANT = 1\n',
        'sub/d.py': 'from ..g import nothing\nfrom .e import y\n',
        'sub/e.py': 'from . import *\n',
    })
    graph = import_graph(root, 'pkg')
    self.assertEqual(graph, {
        'pkg': set(),
        'pkg.a': {'pkg.b', 'pkg.c', 'pkg.sub.d', 'pkg.sub.e', 'pkg.sub',
                  'pkg.f', 'pkg.g', 'pkg.sub.h'},
        'pkg.b': {'pkg', 'pkg.c'},
        'pkg.c': {'pkg.a'},
        'pkg.f': {'pkg'},
        'pkg.g': set(),
        'pkg.sub': {'pkg.sub.e', 'pkg.sub.d', 'pkg.g'},
        'pkg.sub.d': {'pkg.g', 'pkg.sub.e'},
        'pkg.sub.e': {'pkg.sub'},
        'pkg.sub.h': set(),
    })
    self.assertEqual(cycles(graph), [
        ['pkg.a', 'pkg.c', 'pkg.a'],
        ['pkg.sub', 'pkg.sub.e', 'pkg.sub'],
    ])

  def test_names_a_cycle_through_a_function(self):
    root = self._package({
        '__init__.py': '',
        'low.py': 'def f():\n  from pkg import top\n  return top\n',
        'mid.py': 'from pkg import low\n',
        'top.py': 'from pkg import mid\n',
        'apart.py': 'from pkg import top\n',
    })
    found = cycles(import_graph(root, 'pkg'))
    self.assertEqual(found, [['pkg.low', 'pkg.top', 'pkg.mid', 'pkg.low']])
    self.assertEqual(describe(found), 'pkg.low -> pkg.top -> pkg.mid -> pkg.low')


if __name__ == '__main__':
  absltest.main()
