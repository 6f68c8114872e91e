"""The configuration reference, generated from the config schema.

Each key of `config_lib.base_config()` has a row in docs/configuration.md
(between the `config-reference` markers): its default and its field's help
text. tests/test_config_doc.py fails when a key has no help or it is stale:

  python -m jaxgrpo.config_doc            # print the table
  python -m jaxgrpo.config_doc --write    # rewrite the table in the page
"""

import argparse
import os
import sys

import ml_collections

from jaxgrpo import config_lib

START = '<!-- config-reference:start (python -m jaxgrpo.config_doc --write) -->'
END = '<!-- config-reference:end -->'
PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'docs', 'configuration.md')


def defaults(config: ml_collections.ConfigDict | None = None,
             where: str = '') -> dict[str, object]:
  """Every key of `config_lib.base_config()` with its default, in order."""
  out = {}
  for key, value in (config or config_lib.base_config()).items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(defaults(value, f'{where}{key}.'))
    else:
      out[where + key] = value
  return out


def _show(value) -> str:
  if isinstance(value, str):
    return f'`{value}`'
  if isinstance(value, list):  # data.datasets
    return ('one arithmetic dataset' if len(value) == 1
            else f'{len(value)} datasets')
  return '`()`' if value == () else str(value)


def check_rows(keys: dict[str, object]) -> None:
  """Raises ValueError naming the keys that have no help text."""
  helps = config_lib.help_texts()
  missing = [k for k in keys if not helps.get(k)]
  if missing:
    raise ValueError(f'config keys without help text: {missing}; add it to '
                     'their field')


def table() -> str:
  """The markdown table: one row per key, in schema order."""
  keys = defaults()
  check_rows(keys)
  cell = lambda text: text.replace('|', '\\|')  # in code spans too (GFM)
  return '\n'.join(['| key | default | meaning |', '| --- | --- | --- |'] + [
      f'| `{name}` | {cell(_show(keys[name]))} | {cell(meaning)} |'
      for name, meaning in config_lib.help_texts().items()])


def replace_in(text: str, new_table: str) -> str:
  """`text` with the table between the markers replaced."""
  if START not in text or END not in text:
    raise ValueError(f'the page has no {START!r} ... {END!r} markers')
  head, rest = text.split(START, 1)
  return f'{head}{START}\n{new_table}\n{END}{rest.split(END, 1)[1]}'


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
