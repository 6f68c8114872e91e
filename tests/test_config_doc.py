"""The configuration table of docs/configuration.md is the one the config
code generates."""

from absl.testing import absltest

from jaxgrpo import config_doc


class ConfigDocTest(absltest.TestCase):

  def test_every_key_has_a_row(self):
    config_doc.check_rows(config_doc.defaults())  # raises naming the key

  def test_page_table_is_current(self):
    with open(config_doc.PAGE, encoding='utf-8') as f:
      text = f.read()
    self.assertEqual(
        config_doc.replace_in(text, config_doc.table()), text,
        'docs/configuration.md table is stale: run '
        'python -m jaxgrpo.config_doc --write')

  def test_a_missing_row_is_named(self):
    keys = dict(config_doc.defaults(), **{'rollout.new_knob': 3})
    with self.assertRaisesRegex(ValueError, 'rollout.new_knob'):
      config_doc.check_rows(keys)


if __name__ == '__main__':
  absltest.main()
