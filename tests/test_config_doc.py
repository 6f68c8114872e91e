"""The configuration table of docs/configuration.md is the one the config
schema generates, and every setting has its help text."""

from absl.testing import absltest

from jaxgrpo import checks
from jaxgrpo import config_doc
from jaxgrpo import config_lib


class ConfigDocTest(absltest.TestCase):

  def test_every_key_has_a_row(self):
    rows = config_lib.settings()
    self.assertEqual([key for key, _, text in rows if not text], [])
    keys = [key for key, _, _ in rows]
    self.assertIn('rollout.short_batch', keys)
    self.assertIn('model.lora.rank', keys)  # nested sections too
    self.assertLen(config_doc.table().splitlines(), len(rows) + 2)

  def test_page_table_is_current(self):
    with open(config_doc.PAGE, encoding='utf-8') as f:
      text = f.read()
    self.assertEqual(
        config_doc.replace_in(text, config_doc.table()), text,
        'docs/configuration.md table is stale: run '
        'python -m jaxgrpo.config_doc --write')

  def test_a_missing_row_is_named(self):

    class Knobs(checks.Section, name='rollout'):
      new_knob: int = checks.field(3)

    with self.assertRaisesRegex(ValueError, 'rollout.new_knob'):
      config_doc.table(config_lib.settings(Knobs(), 'rollout.'))


if __name__ == '__main__':
  absltest.main()
