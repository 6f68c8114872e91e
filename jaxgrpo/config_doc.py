"""The configuration reference of docs/configuration.md, from the schema.

  python -m jaxgrpo.config_doc            # print the tables
  python -m jaxgrpo.config_doc --write    # rewrite them between the markers

Each setting's row is its default and its field's help text, in schema
order, with the options of a `one_of` rule that the help does not name
(so that whatever a registry holds is listed): the settings' table, and the
keys of a `data.datasets` entry (from `data.entry.DatasetSection`).
tests/test_config_doc.py fails when a table of the page is stale.
"""

import argparse
import dataclasses
import pathlib
import sys

from jaxgrpo import config_lib
from jaxgrpo.data import entry as entry_lib

PAGE = pathlib.Path(__file__).resolve().parents[1] / 'docs/configuration.md'


def _show(value) -> str:
  if value is dataclasses.MISSING:
    return 'required'
  if isinstance(value, str):
    return f'`{value}`'
  if isinstance(value, tuple) and value and isinstance(
      value[0], entry_lib.DatasetSection):  # data.datasets
    return ('one arithmetic dataset' if len(value) == 1
            else f'{len(value)} datasets')
  return '`()`' if value == () else str(value)


def dataset_keys() -> list[tuple[str, object, str, tuple[str, ...]]]:
  """(key, default, help text, options) of a dataset entry's keys."""
  return config_lib.settings(entry_lib.DatasetSection)


def meaning(text: str, options: tuple[str, ...]) -> str:
  """The help text with the options it does not name."""
  unnamed = [f'`{o}`' for o in options if f'`{o}`' not in text]
  if not unnamed:
    return text
  listed = ', '.join(unnamed[:-1]) + ' or ' * (len(unnamed) > 1) + unnamed[-1]
  return f'{text}{"; also" if len(unnamed) < len(options) else ":"} {listed}'


def table(rows=None) -> str:
  """The markdown table of `rows` ((key, default, help, options); default:
  `config_lib.settings()`). Raises ValueError naming keys without help."""
  rows = config_lib.settings() if rows is None else rows
  if missing := [key for key, _, text, _ in rows if not text]:
    raise ValueError(f'config keys without help text: {missing}; add it to '
                     'their field')
  cell = lambda text: text.replace('|', '\\|')  # in code spans too (GFM)
  return '\n'.join(['| key | default | meaning |', '| --- | --- | --- |'] + [
      f'| `{key}` | {cell(_show(default))} | {cell(meaning(text, options))} |'
      for key, default, text, options in rows])


def tables() -> dict[str, str]:
  """Each table of the page by its marker's name."""
  return {'config-reference': table(), 'dataset-keys': table(dataset_keys())}


def replace_in(text: str, name: str, new_table: str) -> str:
  """`text` with the table between the `name` markers replaced."""
  start = f'<!-- {name}:start (python -m jaxgrpo.config_doc --write) -->'
  end = f'<!-- {name}:end -->'
  if start not in text or end not in text:
    raise ValueError(f'the page has no {start!r} ... {end!r} markers')
  head, rest = text.split(start, 1)
  return f'{head}{start}\n{new_table}\n{end}{rest.split(end, 1)[1]}'


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m jaxgrpo.config_doc')
  parser.add_argument('--write', action='store_true',
                      help='rewrite the tables in docs/configuration.md')
  args = parser.parse_args(argv)
  if args.write and not PAGE.is_file():  # an installed package has no docs/
    parser.error(f'--write works in a clone only: {PAGE} is missing')
  try:
    new = tables()
  except ValueError as e:
    print(f'config_doc: error: {e}', file=sys.stderr)
    return 1
  if not args.write:
    print('\n\n'.join(new.values()))
    return 0
  text = PAGE.read_text(encoding='utf-8')
  for name, new_table in new.items():
    text = replace_in(text, name, new_table)
  PAGE.write_text(text, encoding='utf-8')
  print(f'wrote the configuration tables of {PAGE}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
