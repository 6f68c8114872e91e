r"""The codebase's size and shape, against the house plan's bars.

  python scripts/code_shape.py          # report; exit 1 when a bar is missed

Bars (docs/testing.md):
  * no function or method in jaxgrpo/ longer than 120 lines;
  * no module in jaxgrpo/ longer than 450 lines, unless its docstring has a
    line starting `Size:` that says why;
  * README.md under 300 lines;
  * no import cycles in jaxgrpo/ (tests/test_layout.py checks the graph).

Lengths count every line from a definition's `def` to its last line,
docstring and comments included.
"""

import argparse
import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, 'jaxgrpo')
MAX_FUNCTION = 120
MAX_MODULE = 450
MAX_README = 300


def modules(root: str = PACKAGE):
  """Paths of every .py file under `root`, sorted."""
  out = []
  for folder, _, files in os.walk(root):
    out.extend(os.path.join(folder, f) for f in files if f.endswith('.py'))
  return sorted(out)


def functions(path: str) -> list[tuple[str, int, int]]:
  """(qualified name, first line, length) of every function in `path`."""
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), path)
  out = []

  def visit(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = prefix + child.name
        out.append((name, child.lineno, child.end_lineno - child.lineno + 1))
        visit(child, name + '.')
      elif isinstance(child, ast.ClassDef):
        visit(child, prefix + child.name + '.')

  visit(tree, '')
  return out


def module_reason(path: str) -> str | None:
  """The `Size:` line of a module's docstring, if it has one."""
  with open(path, encoding='utf-8') as f:
    doc = ast.get_docstring(ast.parse(f.read(), path)) or ''
  for line in doc.splitlines():
    if line.strip().startswith('Size:'):
      return line.strip()
  return None


def measure(repo: str = REPO) -> dict:
  """Every measurement the bars need."""
  package = os.path.join(repo, 'jaxgrpo')
  funcs, mods = [], []
  for path in modules(package):
    rel = os.path.relpath(path, repo)
    with open(path, encoding='utf-8') as f:
      n = sum(1 for _ in f)
    mods.append((rel, n, module_reason(path)))
    funcs.extend((rel, name, line, length)
                 for name, line, length in functions(path))
  with open(os.path.join(repo, 'README.md'), encoding='utf-8') as f:
    readme = sum(1 for _ in f)
  return {'functions': sorted(funcs, key=lambda x: -x[3]),
          'modules': sorted(mods, key=lambda x: -x[1]), 'readme': readme}


def misses(m: dict) -> list[str]:
  """One line per missed bar."""
  out = [f'{rel}:{line} {name} is {length} lines (bar {MAX_FUNCTION})'
         for rel, name, line, length in m['functions']
         if length > MAX_FUNCTION]
  out += [f'{rel} is {n} lines (bar {MAX_MODULE}) with no `Size:` reason'
          for rel, n, reason in m['modules'] if n > MAX_MODULE and not reason]
  if m['readme'] >= MAX_README:
    out.append(f'README.md is {m["readme"]} lines (bar {MAX_README})')
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--top', type=int, default=10,
                      help='longest functions and modules to list')
  args = parser.parse_args(argv)
  m = measure()
  print(f'README.md: {m["readme"]} lines')
  print(f'\nlongest functions (of {len(m["functions"])}):')
  for rel, name, line, length in m['functions'][:args.top]:
    print(f'  {length:4d}  {rel}:{line} {name}')
  print(f'\nlongest modules (of {len(m["modules"])}):')
  for rel, n, reason in m['modules'][:args.top]:
    print(f'  {n:4d}  {rel}' + (f'  ({reason})' if reason else ''))
  missed = misses(m)
  print('\n' + ('\n'.join(f'MISSED: {x}' for x in missed) if missed
                else 'every bar met'))
  return 1 if missed else 0


if __name__ == '__main__':
  sys.exit(main())
