r"""The codebase's size and shape, against the house plan's bars.

  python scripts/code_shape.py          # report; exit 1 when a bar is missed

Bars (docs/testing.md):
  * no function or method in jaxgrpo/ longer than 120 lines, and none
    longer than 80 without a docstring line starting `Length:` that says
    why;
  * no module in jaxgrpo/ longer than 400 lines (`PLAIN_MODULE`; the
    house plan's bar is 450) unless its docstring has a line starting
    `Size:` that says why;
  * README.md under 300 lines;
  * no import cycles in jaxgrpo/ (tests/test_layout.py checks the graph);
  * the config layer (every line that declares, checks or documents a
    setting: `CONFIG_FILES`, every config section and `CONFIG_PARTS`) a
    third below the 1,178 lines it had before the schema held each setting
    once (`CONFIG_BASELINE`).

Lengths count every line from a definition's `def` to its last line,
docstring and comments included. A part of a module in the config layer
counts as it would in a file of its own: with the comments above it and
the blank lines around it.
"""

import argparse
import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, 'jaxgrpo')
MAX_FUNCTION = 120
PLAIN_FUNCTION = 80  # longer needs a `Length:` reason
PLAIN_MODULE = 400  # longer needs a `Size:` reason
MAX_README = 300
# The config layer: these files, every config section (a class based on
# `Section`) and these parts of the library modules that define the classes
# named (the checks of the library dataclasses that extend a section, and
# the mesh rules').
CONFIG_FILES = ('configs/common.py', 'jaxgrpo/config_lib.py',
                'jaxgrpo/config_doc.py', 'jaxgrpo/checks.py',
                'jaxgrpo/data/entry.py')
CONFIG_PARTS = (
    ('MeshSection', ('_PAIRS', 'mesh_shape')),
    ('DistributedSection', ('_is_host_port',)),
    ('ArithmeticSpec', ('ArithmeticSpec.__post_init__', 'spec_checks')),
    ('PolicyConfig', ('PolicyConfig.__post_init__',)),
    ('LossConfig', ('LossConfig.__post_init__',)),
    ('RolloutConfig', ('RolloutConfig._validate',)),
)
# configs/common.py 233 + jaxgrpo/config_lib.py 659 + jaxgrpo/config_doc.py
# 236 lines, and ~50 lines of library dataclass checks repeating them.
CONFIG_BASELINE = 1178
MAX_CONFIG = CONFIG_BASELINE * 2 // 3


def modules(root: str = PACKAGE):
  """Paths of every .py file under `root`, sorted."""
  out = []
  for folder, _, files in os.walk(root):
    out.extend(os.path.join(folder, f) for f in files if f.endswith('.py'))
  return sorted(out)


def _reason(node: ast.AST, label: str) -> str | None:
  """The line of a docstring that starts with `label`, if there is one."""
  for line in (ast.get_docstring(node) or '').splitlines():
    if line.strip().startswith(label):
      return line.strip()
  return None


def functions(path: str) -> list[tuple[str, int, int, str | None]]:
  """(qualified name, first line, length, `Length:` reason) of every
  function in `path`."""
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), path)
  out = []

  def visit(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = prefix + child.name
        out.append((name, child.lineno, child.end_lineno - child.lineno + 1,
                    _reason(child, 'Length:')))
        visit(child, name + '.')
      elif isinstance(child, ast.ClassDef):
        visit(child, prefix + child.name + '.')

  visit(tree, '')
  return out


def module_reason(path: str) -> str | None:
  """The `Size:` line of a module's docstring, if it has one."""
  with open(path, encoding='utf-8') as f:
    return _reason(ast.parse(f.read(), path), 'Size:')


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
  """Top-level classes, functions and assignments by name; methods as
  'Class.method'."""
  out = {}
  for node in tree.body:
    targets = getattr(node, 'targets', None) or [getattr(node, 'target', None)]
    for name in [getattr(node, 'name', None)] + [
        getattr(t, 'id', None) for t in targets]:
      if name:
        out[name] = node
    if isinstance(node, ast.ClassDef):
      out.update({f'{node.name}.{m.name}': m for m in node.body
                  if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))})
  return out


def _span(lines: list[str], node: ast.AST) -> int:
  """Lines of a definition, with its decorators, the comments above it and
  the blank lines that set it apart (2 at the top level, 1 in a class)."""
  first = min([node.lineno] + [d.lineno for d in getattr(
      node, 'decorator_list', [])])
  while first > 1 and lines[first - 2].strip().startswith('#'):
    first -= 1
  return node.end_lineno - first + (3 if node.col_offset == 0 else 2)


def config_layer(repo: str = REPO) -> list[tuple[str, int]]:
  """(what, lines) of each part of the config layer; 0 for a part of
  `CONFIG_PARTS` not found."""
  out = []
  for rel in CONFIG_FILES:
    with open(os.path.join(repo, rel), encoding='utf-8') as f:
      out.append((rel, sum(1 for _ in f)))
  parts = {anchor: names for anchor, names in CONFIG_PARTS}
  for path in modules(os.path.join(repo, 'jaxgrpo')):
    rel = os.path.relpath(path, repo)
    if rel in CONFIG_FILES:
      continue
    with open(path, encoding='utf-8') as f:
      text = f.read()
    found, lines = _definitions(ast.parse(text)), text.splitlines()
    for name, node in found.items():
      if isinstance(node, ast.ClassDef) and any(
          getattr(b, 'id', getattr(b, 'attr', '')) == 'Section'
          for b in node.bases):
        out.append((f'{rel} {name}', _span(lines, node)))
    for anchor in [a for a in parts if a in found]:
      out += [(f'{rel} {name}', _span(lines, found[name]))
              for name in parts.pop(anchor) if name in found]
  out += [(f'{anchor}: {names}', 0) for anchor, names in parts.items()]
  return out


def measure(repo: str = REPO) -> dict:
  """Every measurement the bars need."""
  package = os.path.join(repo, 'jaxgrpo')
  funcs, mods = [], []
  for path in modules(package):
    rel = os.path.relpath(path, repo)
    with open(path, encoding='utf-8') as f:
      n = sum(1 for _ in f)
    mods.append((rel, n, module_reason(path)))
    funcs.extend((rel, name, line, length, reason)
                 for name, line, length, reason in functions(path))
  with open(os.path.join(repo, 'README.md'), encoding='utf-8') as f:
    readme = sum(1 for _ in f)
  return {'functions': sorted(funcs, key=lambda x: -x[3]),
          'modules': sorted(mods, key=lambda x: -x[1]), 'readme': readme,
          'config': config_layer(repo)}


def misses(m: dict) -> list[str]:
  """One line per missed bar."""
  out = [f'{rel}:{line} {name} is {length} lines (bar {MAX_FUNCTION})'
         for rel, name, line, length, _ in m['functions']
         if length > MAX_FUNCTION]
  out += [f'{rel}:{line} {name} is {length} lines (over {PLAIN_FUNCTION}) '
          'with no `Length:` reason'
          for rel, name, line, length, reason in m['functions']
          if PLAIN_FUNCTION < length <= MAX_FUNCTION and not reason]
  out += [f'{rel} is {n} lines (over {PLAIN_MODULE}) with no `Size:` reason'
          for rel, n, reason in m['modules'] if n > PLAIN_MODULE and not reason]
  if m['readme'] >= MAX_README:
    out.append(f'README.md is {m["readme"]} lines (bar {MAX_README})')
  out += [f'config layer part not found: {what}'
          for what, n in m['config'] if not n]
  total = sum(n for _, n in m['config'])
  if total > MAX_CONFIG:
    out.append(f'the config layer is {total} lines (bar {MAX_CONFIG}: a '
               f'third below {CONFIG_BASELINE})')
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--top', type=int, default=10,
                      help='longest functions and modules to list')
  args = parser.parse_args(argv)
  m = measure()
  print(f'README.md: {m["readme"]} lines')
  print(f'\nlongest functions (of {len(m["functions"])}):')
  for rel, name, line, length, reason in m['functions'][:args.top]:
    print(f'  {length:4d}  {rel}:{line} {name}'
          + (f'  ({reason[:70]})' if reason else ''))
  print(f'\nlongest modules (of {len(m["modules"])}):')
  for rel, n, reason in m['modules'][:args.top]:
    print(f'  {n:4d}  {rel}' + (f'  ({reason})' if reason else ''))
  total = sum(n for _, n in m['config'])
  print(f'\nconfig layer: {total} lines, {total / CONFIG_BASELINE:.0%} of '
        f'{CONFIG_BASELINE} before (bar {MAX_CONFIG}):')
  for what, n in m['config']:
    print(f'  {n:4d}  {what}')
  missed = misses(m)
  print('\n' + ('\n'.join(f'MISSED: {x}' for x in missed) if missed
                else 'every bar met'))
  return 1 if missed else 0


if __name__ == '__main__':
  sys.exit(main())
