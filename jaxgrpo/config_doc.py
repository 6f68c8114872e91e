"""The configuration reference of docs/configuration.md, from the schema.

  python -m jaxgrpo.config_doc            # print the table
  python -m jaxgrpo.config_doc --write    # rewrite it between the markers

Each setting's row is its default and its field's help text, in schema
order; tests/test_config_doc.py fails when the page's table is stale.
"""

import argparse
import os
import sys

from jaxgrpo import config_lib

START = '<!-- config-reference:start (python -m jaxgrpo.config_doc --write) -->'
END = '<!-- config-reference:end -->'
PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'docs', 'configuration.md')


def _show(value) -> str:
  if isinstance(value, str):
    return f'`{value}`'
  if isinstance(value, tuple) and value and isinstance(
      value[0], config_lib.sources.DatasetSection):  # data.datasets
    return ('one arithmetic dataset' if len(value) == 1
            else f'{len(value)} datasets')
  return '`()`' if value == () else str(value)


def table(rows=None) -> str:
  """The markdown table of `rows` ((key, default, help) triples; default:
  `config_lib.settings()`). Raises ValueError naming keys without help."""
  rows = config_lib.settings() if rows is None else rows
  if missing := [key for key, _, text in rows if not text]:
    raise ValueError(f'config keys without help text: {missing}; add it to '
                     'their field')
  cell = lambda text: text.replace('|', '\\|')  # in code spans too (GFM)
  return '\n'.join(['| key | default | meaning |', '| --- | --- | --- |'] + [
      f'| `{key}` | {cell(_show(default))} | {cell(text)} |'
      for key, default, text in rows])


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
  if args.write:
    with open(args.page, encoding='utf-8') as f:
      text = replace_in(f.read(), new_table)
    with open(args.page, 'w', encoding='utf-8') as f:
      f.write(text)
  print(f'wrote the configuration table of {args.page}' if args.write
        else new_table)
  return 0


if __name__ == '__main__':
  sys.exit(main())
