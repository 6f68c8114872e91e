"""The configuration reference table, generated from the config schema.

Every key of `config_lib.base_config()` has one row, its default and
its help text from the schema's fields (`jaxgrpo/config_lib.py`), so the
table of `docs/configuration.md` (between the `config-reference` markers)
cannot drift from it. `tests/test_config_doc.py` fails when a key has no
help text or the table is stale:

  python -m jaxgrpo.config_doc            # print the table
  python -m jaxgrpo.config_doc --write    # rewrite the table in the page
"""

import argparse
import os
import sys

from jaxgrpo import config_lib

START = '<!-- config-reference:start (python -m jaxgrpo.config_doc --write) -->'
END = '<!-- config-reference:end -->'
# The page with the table.
PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'docs', 'configuration.md')


def _leaves(config, prefix: str = '') -> dict[str, object]:
  """Flat 'section.key' -> default of a ConfigDict, in definition order."""
  out = {}
  for key, value in config.items():
    name = f'{prefix}{key}'
    if hasattr(value, 'items') and key != 'datasets':
      out.update(_leaves(value, name + '.'))
    else:
      out[name] = value
  return out


def defaults() -> dict[str, object]:
  """Every key of `config_lib.base_config()` with its default."""
  return _leaves(config_lib.base_config())


def _show(value) -> str:
  if isinstance(value, str):
    return f'`{value}`'
  if isinstance(value, (list, tuple)) and not value:
    return '`()`'
  if isinstance(value, list):
    return 'one arithmetic dataset' if len(value) == 1 else f'{len(value)} datasets'
  return str(value)


def check_rows(keys: dict[str, object]) -> None:
  """Raises ValueError naming the keys that have no help text."""
  helps = config_lib.help_texts()
  missing = [k for k in keys if not helps.get(k)]
  if missing:
    raise ValueError(f'config keys without help text: {missing}; add it to '
                     'their field in jaxgrpo/config_lib.py')


def table() -> str:
  """The markdown table: one row per key, in schema order."""
  keys = defaults()
  check_rows(keys)
  lines = ['| key | default | meaning |', '| --- | --- | --- |']
  for name, meaning in config_lib.help_texts().items():
    lines.append(f'| `{name}` | {_show(keys[name])} | {meaning} |')
  return '\n'.join(lines)


def replace_in(text: str, new_table: str) -> str:
  """`text` with the table between the markers replaced."""
  if START not in text or END not in text:
    raise ValueError(f'the page has no {START!r} ... {END!r} markers')
  head, rest = text.split(START, 1)
  _, tail = rest.split(END, 1)
  return f'{head}{START}\n{new_table}\n{END}{tail}'


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m jaxgrpo.config_doc')
  parser.add_argument('--write', action='store_true',
                      help='rewrite the table in docs/configuration.md')
  parser.add_argument('--page', default=PAGE)
  args = parser.parse_args(argv)
  try:
    new_table = table()
  except ValueError as e:
    print(f'config_doc: error: {e}', file=sys.stderr)
    return 1
  if not args.write:
    print(new_table)
    return 0
  with open(args.page, encoding='utf-8') as f:
    text = f.read()
  with open(args.page, 'w', encoding='utf-8') as f:
    f.write(replace_in(text, new_table))
  print(f'wrote the configuration table of {args.page}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
