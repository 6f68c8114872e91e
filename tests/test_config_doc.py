"""The configuration table of docs/configuration.md is the one the config
schema generates, and every setting has its help text."""

import contextlib
import dataclasses
import io
import pathlib
from unittest import mock

from absl.testing import absltest

from jaxgrpo import checks
from jaxgrpo import config_doc
from jaxgrpo import config_lib
from jaxgrpo.data import entry


class ConfigDocTest(absltest.TestCase):

  def test_every_key_has_a_row(self):
    rows = config_lib.settings()
    self.assertEqual([key for key, _, text, _ in rows if not text], [])
    keys = [key for key, *_ in rows]
    self.assertIn('rollout.short_batch', keys)
    self.assertIn('model.lora.rank', keys)  # nested sections too
    self.assertLen(config_doc.table().splitlines(), len(rows) + 2)

  def test_page_tables_are_current(self):
    with open(config_doc.PAGE, encoding='utf-8') as f:
      text = f.read()
    tables = config_doc.tables()
    self.assertEqual(list(tables), ['config-reference', 'dataset-keys'])
    for name, table in tables.items():
      self.assertIn(table, text)
      self.assertEqual(
          config_doc.replace_in(text, name, table), text,
          f'docs/configuration.md table {name} is stale: run '
          'python -m jaxgrpo.config_doc --write')

  def test_every_dataset_key_has_a_row(self):
    keys = config_doc.dataset_keys()
    self.assertEqual(
        [key for key, *_ in keys],
        [f.name for f in dataclasses.fields(entry.DatasetSection)])
    self.assertEqual([key for key, _, text, _ in keys if not text], [])
    self.assertIn('| `name` | required |', config_doc.table(keys))

  def test_every_option_is_in_its_row(self):
    # An option added to a registry (a preset, a policy, an estimator) is
    # selectable at once, and the reference lists it without an edit.
    rows = config_lib.settings() + [
        ('data.datasets[].' + key, *rest)
        for key, *rest in config_doc.dataset_keys()]
    keys = [key for key, _, _, options in rows if options]
    for key in ('model.preset', 'sampler.policy', 'rl.advantage',
                'data.datasets[].kind'):
      self.assertIn(key, keys)
    table = config_doc.table(rows).splitlines()[2:]
    for (key, _, _, options), line in zip(rows, table, strict=True):
      self.assertTrue(line.startswith(f'| `{key}` |'), line)
      for name in options:
        self.assertIn(f'`{name}`', line, f'{key}: option {name!r} unlisted')

  def test_unnamed_options_are_added(self):
    self.assertEqual(config_doc.meaning('the size', ('a', 'b', 'c')),
                     'the size: `a`, `b` or `c`')
    self.assertEqual(config_doc.meaning('`a` (one) or `b`', ('a', 'b', 'c')),
                     '`a` (one) or `b`; also `c`')
    self.assertEqual(config_doc.meaning('`a` or `b`', ('a', 'b')),
                     '`a` or `b`')

  def test_a_missing_row_is_named(self):

    class Knobs(checks.Section, name='rollout'):
      new_knob: int = checks.field(3)

    with self.assertRaisesRegex(ValueError, 'rollout.new_knob'):
      config_doc.table(config_lib.settings(Knobs(), 'rollout.'))

  def test_write_outside_a_clone_says_so(self):
    # An installed package has no docs/: --write names that, no traceback.
    page = pathlib.Path(self.create_tempdir().full_path) / 'docs/c.md'
    err = io.StringIO()
    with mock.patch.object(config_doc, 'PAGE', page), \
        contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as e:
      config_doc.main(['--write'])
    self.assertEqual(e.exception.code, 2)
    self.assertIn(f'error: --write works in a clone only: {page} is missing',
                  err.getvalue())
    self.assertFalse(page.exists())

if __name__ == '__main__':
  absltest.main()
