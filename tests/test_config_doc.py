"""The configuration table of docs/configuration.md is the one the config
schema generates, and every setting has its help text."""

import dataclasses

from absl.testing import absltest

from jaxgrpo import checks
from jaxgrpo import config_doc
from jaxgrpo import config_lib
from jaxgrpo.data import entry


class ConfigDocTest(absltest.TestCase):

  def test_every_key_has_a_row(self):
    rows = config_lib.settings()
    self.assertEqual([key for key, _, text in rows if not text], [])
    keys = [key for key, _, _ in rows]
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
        [key for key, _, _ in keys],
        [f.name for f in dataclasses.fields(entry.DatasetSection)])
    self.assertEqual([key for key, _, text in keys if not text], [])
    self.assertIn('| `name` | required |', config_doc.table(keys))

  def test_every_option_is_named_in_its_help(self):
    # An option added to a registry (a preset, a policy, an estimator) is
    # selectable at once; its setting's help must name it too.
    def options(section, where=''):
      for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, checks.Section):
          yield from options(value, f'{where}{f.name}.')
        elif choices := getattr(f.metadata.get('check'), 'choices', None):
          yield where + f.name, f.metadata['help'], tuple(
              choices() if callable(choices) else choices)

    found = list(options(config_lib.Config()))
    found += [('data.datasets[].' + key, text, names) for key, text, names in
              options(entry.DatasetSection(name='a', kind='arithmetic'))]
    self.assertIn('sampler.policy', [key for key, _, _ in found])
    self.assertIn('data.datasets[].kind', [key for key, _, _ in found])
    for key, text, names in found:
      for name in names:
        self.assertIn(f'`{name}`', text, f'{key}: option {name!r} unnamed')

  def test_a_missing_row_is_named(self):

    class Knobs(checks.Section, name='rollout'):
      new_knob: int = checks.field(3)

    with self.assertRaisesRegex(ValueError, 'rollout.new_knob'):
      config_doc.table(config_lib.settings(Knobs(), 'rollout.'))


if __name__ == '__main__':
  absltest.main()
