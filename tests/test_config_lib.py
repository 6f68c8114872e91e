"""Tests for config validation: every bad value names its key."""

import json
import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections
from ml_collections import config_dict
import numpy as np

from jaxgrpo import config_lib
from jaxgrpo import configs
from jaxgrpo import errors
from jaxgrpo.configs import common
from jaxgrpo.configs import demo
from jaxgrpo.configs import qa_mixture
from jaxgrpo.configs import squad_qa
from jaxgrpo.rl import advantages


class ConfigTest(parameterized.TestCase):

  def test_demo_and_runlocal_validate(self):
    full = config_lib.from_config_dict(demo.get_config())
    local = config_lib.from_config_dict(demo.get_config('runlocal'))
    self.assertGreater(full.total_steps, local.total_steps)
    self.assertEqual(local.total_steps, 2)

  @parameterized.parameters(
      ('rollout', 'group_size', 1, 'rollout.group_size=1'),
      ('rl', 'eps_low', -0.1, 'rl.eps_low=-0.1'),
      ('rl', 'eps_high', -0.5, 'rl.eps_high=-0.5'),
      ('rollout', 'max_new_tokens', 0, 'rollout.max_new_tokens=0'),
      ('rollout', 'surplus', 'keep', 'rollout.surplus'),
      ('rl', 'loss_agg', 'sum', 'rl.loss_agg'),
      ('rl', 'cut_completions', 'drop', "rl.cut_completions='drop'"),
      ('rl', 'advantage', 'ppo', 'rl.advantage'),
      ('sampler', 'policy', 'sometimes', 'sampler.policy'),
      ('rollout', 'top_p', 0.0, 'rollout.top_p'),
      ('rollout', 'temperature', 1e-20,
       r'rollout.temperature=1e-20: must be 0 or >= 1e-06'),
      ('eval', 'temperature', 1e-9, r'eval.temperature=1e-09: must be 0 or'),
      ('model', 'dtype', 'float16', 'model.dtype'),
      ('rollout', 'long_prompts', 'cut', "rollout.long_prompts='cut'"),
  )
  def test_bad_value_names_key(self, section, key, value, expected):
    c = demo.get_config()
    c[section][key] = value
    with self.assertRaisesRegex(config_lib.ConfigError, expected):
      config_lib.from_config_dict(c)

  def test_infinity_is_refused_except_where_it_means_no_limit(self):
    for key in ('optim.learning_rate', 'warmstart.learning_rate', 'rl.beta',
                'rollout.temperature', 'eval.temperature', 'model.lora.alpha',
                'optim.weight_decay', 'sampler.prior_strength',
                'verify.timeout_s', 'checkpoint.every_minutes'):
      c = demo.get_config()
      section, name = key.rsplit('.', 1)
      c[section][name] = float('inf')
      with self.assertRaisesRegex(config_lib.ConfigError,
                                  rf'^{key}=inf: must be finite$'):
        config_lib.from_config_dict(c)
    c = demo.get_config()
    c.optim.max_grad_norm = c.rl.eps_high = float('inf')  # no clipping
    cfg = config_lib.from_config_dict(c)
    self.assertEqual((cfg.optim.max_grad_norm, cfg.rl.eps_high),
                     (float('inf'), float('inf')))

  def test_bad_input_modes(self):
    c = demo.get_config()
    self.assertEqual(config_lib.from_config_dict(c).rollout.long_prompts,
                     'error')
    for mode in ('truncate', 'drop'):
      c.rollout.long_prompts = mode
      self.assertEqual(config_lib.from_config_dict(c).rollout.long_prompts,
                       mode)
    entry = dict(name='qa', kind='jsonl', path='/data/qa.jsonl')
    c = demo.get_config()
    c.data.datasets = [common.arithmetic_dataset(), entry]
    self.assertEqual(
        config_lib.from_config_dict(c).data.datasets[1].on_bad_record, 'error')
    c.data.datasets = [common.arithmetic_dataset(),
                       dict(entry, on_bad_record='skip')]
    self.assertEqual(
        config_lib.from_config_dict(c).data.datasets[1].on_bad_record, 'skip')
    c.data.datasets = [common.arithmetic_dataset(),
                       dict(entry, on_bad_record='ignore')]
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        r"^data.datasets\[1\].on_bad_record='ignore': must be one of "
        r"\('error', 'skip'\)"):
      config_lib.from_config_dict(c)

  def test_dataset_entry_values_of_the_wrong_type_are_named(self):
    # A dataset entry is a plain dict: `weight='0.5'` was a TypeError
    # traceback from its rule, `num_eval=2.5` and `weight=inf` accepted.
    for keys, expected in (
        (dict(weight='0.5'), r"weight='0.5': must be a number, not str"),
        (dict(num_train=None), 'num_train=None: must be an int, not NoneType'),
        (dict(num_eval=2.5), 'num_eval=2.5: must be an int, not float'),
        (dict(snooze_factor='3'),
         "snooze_factor='3': must be an int or None, not str"),
        (dict(verifier=None),
         'verifier=None: must be a string, a dict or a list, not NoneType'),
        (dict(weight=float('inf')),
         'weight=inf: must be a finite number >= 0'),
    ):
      c = common.base_config()
      c.data.datasets = [common.arithmetic_dataset(**keys)]
      with self.subTest(keys=keys), self.assertRaisesRegex(
          config_lib.ConfigError, rf'^data\.datasets\[0\]\.{expected}'):
        config_lib.from_config_dict(c)
    # A blank template or field name failed every record as a bad one
    # (under on_bad_record='skip': 'none left'); id_field='' was no id.
    for key, value in (('template', ''), ('id_field', ''),
                       ('prompt_field', '  ')):
      c = common.base_config()
      c.data.datasets = [dict(name='qa', kind='jsonl', path='qa.jsonl',
                              **{key: value})]
      with self.subTest(key=key), self.assertRaisesRegex(
          config_lib.ConfigError,
          rf"^data\.datasets\[0\]\.{key}='{value}': must not be blank$"):
        config_lib.from_config_dict(c)
    c = common.base_config()
    c.data.datasets = [common.arithmetic_dataset(
        weight=1, verifier=[{'name': 'math', 'weight': 2}, 'format'],
        unanswerable='missing')]
    self.assertEqual(config_lib.from_config_dict(c).data.datasets[0].weight,
                     1)

  def test_unknown_key_named(self):
    c = demo.get_config().to_dict()
    c['rollout']['gruop_size'] = 3
    with self.assertRaisesRegex(
        config_lib.ConfigError, r'^unknown config key rollout.gruop_size '
        r'\(did you mean rollout.group_size\? known in rollout: '):
      config_lib.from_config_dict(c)
    c = demo.get_config().to_dict()
    c['totl_steps'] = 3
    with self.assertRaisesRegex(config_lib.ConfigError,
                                r'totl_steps \(did you mean total_steps\?'):
      config_lib.from_config_dict(c)
    c = demo.get_config().to_dict()
    c['data']['datasets'][0]['wieght'] = 2
    with self.assertRaisesRegex(
        config_lib.ConfigError, r'data.datasets\[0\].wieght \(did you mean '
        r'data.datasets\[0\].weight\?'):
      config_lib.from_config_dict(c)
    c['data']['datasets'][0] = {'name': 'a', 'kind': 'arithmetic', 'zzz': 1}
    with self.assertRaisesRegex(config_lib.ConfigError,
                                r'datasets\[0\].zzz \(known in'):
      config_lib.from_config_dict(c)

  def test_unset_required_placeholders_are_named(self):
    c = demo.get_config()
    c.seed = config_dict.required_placeholder(int)
    c.model.path = 'smollm2'
    c.model.system_prompt = config_dict.required_placeholder(str)
    with self.assertRaisesRegex(
        config_lib.ConfigError, r'^model.system_prompt, seed must be given '
        r'\(a config_dict.required_placeholder left unset\)$'):
      config_lib.from_config_dict(c)
    c.seed, c.model.system_prompt = 3, 'Be brief.'
    cfg = config_lib.from_config_dict(c)
    self.assertEqual((cfg.seed, cfg.model.system_prompt), (3, 'Be brief.'))

  def test_missing_key_named(self):
    c = demo.get_config().to_dict()
    del c['rollout']['group_size']
    with self.assertRaisesRegex(
        config_lib.ConfigError, r'^config key missing: rollout.group_size; '
        r'start from jaxgrpo.configs.common.base_config\(\), which holds '
        'every key at its default'):
      config_lib.from_config_dict(c)

  def test_hand_built_config_is_told_every_missing_key_at_once(self):
    # A ConfigDict written by hand (a notebook) was refused one missing key
    # at a time, without a word of base_config().
    c = ml_collections.ConfigDict(
        {'total_steps': 5, 'rollout': {'batch_size': 4, 'group_size': 4}})
    with self.assertRaisesRegex(
        config_lib.ConfigError, r'^config keys missing: seed, log_every, '
        r'plots, .*, model, data, sampler, .*, distributed; start from '
        r'jaxgrpo.configs.common.base_config\(\)'):
      config_lib.from_config_dict(c)
    full = config_lib.base_config().to_dict()
    full['rollout'] = {'batch_size': 4, 'group_size': 4}
    with self.assertRaises(config_lib.ConfigError) as caught:
      config_lib.from_config_dict(full)
    named = str(caught.exception).split(': ', 1)[1].split('; ')[0]
    self.assertCountEqual(named.split(', '), [
        f'rollout.{k}' for k in config_lib.base_config().rollout
        if k not in ('batch_size', 'group_size')])
    # A dataset entry names its required keys, without the hint.
    c = demo.get_config()
    c.data.datasets = [{'weight': 1.0}]
    with self.assertRaisesRegex(
        config_lib.ConfigError, r'^config keys missing: data.datasets\[0\].'
        r'name, data.datasets\[0\].kind$'):
      config_lib.from_config_dict(c)

  def test_numpy_values_and_integral_floats_are_plain_values(self):
    # A notebook computing settings with numpy: ml_collections refused
    # np.int64 for an int key (TypeError), a plain dict's numpy values
    # reached the Config (json.dumps of the saved config failed), and an
    # integral float (total_steps=1e3) was refused.
    c = demo.get_config()
    c.rollout.batch_size = np.int64(8)
    c.optim.learning_rate = np.float32(0.5)
    c.total_steps = 1e3
    c.plots = np.bool_(False)
    c.rl.num_minibatches = np.array(2)
    c.data.datasets = [ml_collections.ConfigDict(dict(
        name='a', kind='arithmetic', num_eval=np.int32(4), weight=np.float64(2),
        verifier=dict(name='math')))]
    cfg = config_lib.from_config_dict(c)
    got = (cfg.rollout.batch_size, cfg.optim.learning_rate, cfg.total_steps,
           cfg.plots, cfg.rl.num_minibatches, cfg.data.datasets[0].num_eval,
           cfg.data.datasets[0].weight)
    self.assertEqual(got, (8, 0.5, 1000, False, 2, 4, 2.0))
    self.assertEqual([type(v) for v in got],
                     [int, float, int, bool, int, int, float])
    self.assertEqual(cfg.data.datasets[0].verifier, {'name': 'math'})
    json.dumps(config_lib.to_dict(cfg))
    self.assertIs(config_lib.from_config_dict(cfg), cfg)
    for key, value, message in (
        ('total_steps', 2.5, 'total_steps=2.5: must be an int, not float'),
        ('total_steps', np.float64(2.5), 'total_steps=2.5: must be an int'),
        ('plots', 1.0, 'plots=1.0: must be a bool, not float'),
        ('seed', np.array([1, 2]), r'seed=array\(\[1, 2\]\): must be an int'),
        ('total_steps', 'abc', "total_steps='abc': must be an int, not str"),
    ):
      c = demo.get_config()
      c[key] = value
      with self.subTest(key=key, value=value), self.assertRaisesRegex(
          config_lib.ConfigError, message):
        config_lib.from_config_dict(c)

  def test_references_in_a_dataset_entry_are_read(self):
    # A placeholder or a lazy reference in an entry's dict reached the
    # checks as the reference: `data.datasets[0].path=<...FieldReference
    # object at 0x...>: must be a string or None, not FieldReference`.
    c = demo.get_config()
    c.data.datasets = [dict(
        name='a', kind='arithmetic', template=config_dict.placeholder(str),
        max_digits=c.rollout.get_ref('group_size'))]
    c.rollout.group_size = 5
    (entry,) = config_lib.from_config_dict(c).data.datasets
    self.assertEqual((entry.template, entry.max_digits), (None, 5))

  def test_minibatches_must_divide(self):
    c = demo.get_config()
    c.rl.num_minibatches = 3
    with self.assertRaisesRegex(config_lib.ConfigError, 'rl.num_minibatches'):
      config_lib.from_config_dict(c)

  def test_min_fraction_floors_must_fit_the_batch(self):
    c = demo.get_config()
    c.rollout.batch_size = 4
    c.data.datasets = [common.arithmetic_dataset('a', min_fraction=0.3),
                       common.arithmetic_dataset('b', min_fraction=0.5)]
    config_lib.from_config_dict(c)  # floors 2 + 2 = 4
    c.rollout.batch_size = 100  # 0.56 * 100 is 56.00000000000001 in floats
    for entry, fraction in zip(c.data.datasets, (0.44, 0.56)):
      entry['min_fraction'] = fraction
    config_lib.from_config_dict(c)  # floors 44 + 56 = 100
    c.rollout.batch_size = 4
    for fractions in ((0.3, 0.7), (0.6, 0.6)):
      for entry, fraction in zip(c.data.datasets, fractions):
        entry['min_fraction'] = fraction
      with self.assertRaisesRegex(
          config_lib.ConfigError, r'^rollout.batch_size=4: the min_fraction '
          r"floors of data.datasets \({'a': \d, 'b': \d}\) exceed it$"):
        config_lib.from_config_dict(c)

  def test_mixture_mistakes_are_named_without_the_whole_list(self):
    # Each message printed the repr of every entry (about 1,000 characters).
    c = demo.get_config()
    c.data.datasets = [common.arithmetic_dataset('a', weight=0),
                       common.arithmetic_dataset('b', weight=0)]
    with self.assertRaisesRegex(
        config_lib.ConfigError, r'^data.datasets: weights must have a '
        r'positive, finite sum, got a=0, b=0$'):
      config_lib.from_config_dict(c)
    c.data.datasets = [common.arithmetic_dataset('a'),
                       common.arithmetic_dataset('a')]
    with self.assertRaisesRegex(
        config_lib.ConfigError, r"^data.datasets: dataset names must be "
        r"unique, got \['a', 'a'\]$"):
      config_lib.from_config_dict(c)

  def test_a_system_prompt_needs_a_chat_template(self):
    # A preset model has no chat template: the system turn went unused.
    c = demo.get_config()
    c.model.system_prompt = 'Be brief.'
    with self.assertRaisesRegex(
        config_lib.ConfigError, r"^model.system_prompt='Be brief.': needs "
        r'model.path \(a model with a chat template\) and '
        r'model.chat_template=True$'):
      config_lib.from_config_dict(c)
    c.model.path = 'smollm2'
    self.assertEqual(config_lib.from_config_dict(c).model.system_prompt,
                     'Be brief.')
    c.model.chat_template = False
    with self.assertRaisesRegex(config_lib.ConfigError, 'model.system_prompt'):
      config_lib.from_config_dict(c)

  def test_adapter_settings_need_a_rank(self):
    # Ignored without a word: every weight trained.
    for key, value in (('modules', 'blocks/0/attn/q'), ('alpha', 8.0)):
      c = demo.get_config()
      c.model.lora[key] = value
      with self.assertRaisesRegex(
          config_lib.ConfigError, rf'^model.lora.{key}=.*: needs '
          r'model.lora.rank > 0'):
        config_lib.from_config_dict(c)
      c.model.lora.rank, c.warmstart.enabled = 4, False
      self.assertEqual(getattr(config_lib.from_config_dict(c).model.lora, key),
                       value)

  def test_lists_become_tuples(self):
    # A config file writes lists; the frozen Config holds tuples.
    c = demo.get_config().to_dict()
    c['verify']['imports'] = ['json']
    c['curriculum']['checkpoints'] = ['a', 'b']
    cfg = config_lib.from_config_dict(c)
    self.assertEqual(cfg.verify.imports, ('json',))
    self.assertEqual(cfg.curriculum.checkpoints, ('a', 'b'))
    self.assertIsInstance(cfg.data.datasets, tuple)

  def test_registered_advantage_can_be_chosen(self):
    name = 'test_config_lib_zero'
    advantages.register_estimator(name)(lambda rewards, eps: rewards * 0)
    # Other tests in this process list the registry.
    self.addCleanup(advantages._ESTIMATORS.pop, name)  # pylint: disable=protected-access
    c = demo.get_config()
    c.rl.advantage = name
    self.assertEqual(config_lib.from_config_dict(c).rl.advantage, name)

  def test_an_advantage_registered_by_verify_imports_can_be_chosen(self):
    # The modules were imported after the schema checked rl.advantage:
    # 'must be one of ('dr_grpo', 'grpo', 'rloo')' on the command line.
    folder = self.create_tempdir().full_path
    module, name = 'test_config_lib_estimator', 'test_config_lib_sign'
    with open(os.path.join(folder, f'{module}.py'), 'w') as f:
      f.write('from jaxgrpo.rl import advantages\n'
              f'advantages.register_estimator({name!r})(\n'
              '    lambda rewards, eps: rewards * 0)\n')
    sys.path.insert(0, folder)
    self.addCleanup(sys.path.remove, folder)
    self.addCleanup(sys.modules.pop, module, None)
    self.addCleanup(advantages._ESTIMATORS.pop, name, None)  # pylint: disable=protected-access
    c = demo.get_config()
    c.rl.advantage = name
    c.verify.imports = (module,)
    self.assertEqual(config_lib.from_config_dict(c).rl.advantage, name)
    # A module that fails is named as before, with where.
    c.verify.imports = ('no_such_module_here',)
    with self.assertRaisesRegex(errors.ConfigError,
                                r"^verify.imports\[0\]='no_such_module_here'"):
      config_lib.from_config_dict(c)

  def test_parse_arg(self):
    args = common.parse_arg('runlocal,model=small_10m,steps=5',
                            runlocal=False, model='demo', steps=1)
    self.assertEqual((args.runlocal, args.model, args.steps),
                     (True, 'small_10m', 5))
    with self.assertRaisesRegex(ValueError, 'typo'):
      common.parse_arg('typo', runlocal=False)
    self.assertFalse(common.parse_arg('runlocal=off', runlocal=True).runlocal)
    with self.assertRaisesRegex(ValueError, "runlocal='maybe': runlocal takes "
                                'true/1/yes/on/false/0/no/off'):
      common.parse_arg('runlocal=maybe', runlocal=False)
    # Other kinds named too (a bare ValueError of int() before); a None
    # default (a path left unset) takes the text.
    with self.assertRaisesRegex(ValueError, "^config argument steps='x': "
                                'steps takes an int$'):
      common.parse_arg('steps=x', steps=1)
    self.assertEqual(common.parse_arg('path=/a', path=None).path, '/a')

  def test_shared_data_is_found_beside_the_repository(self):
    # The recipes' default data paths: ../shared/data beside the clone,
    # whether a config is loaded as configs/x.py or as jaxgrpo.configs.x,
    # and from any working directory.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    beside = os.path.normpath(os.path.join(
        repo, '..', 'shared', 'data', 'squad2', 'cs224n-dev-v2.0.json'))
    self.assertEqual(configs.shared_data('squad2', 'cs224n-dev-v2.0.json'),
                     beside)
    self.assertEqual(squad_qa.SQUAD2, beside)
    self.assertEqual(qa_mixture.SQUAD2, beside)
    here = os.getcwd()
    try:
      os.chdir(self.create_tempdir().full_path)
      self.assertEqual(configs.shared_data('gsm8k'), os.path.dirname(
          beside).replace('squad2', 'gsm8k'))
    finally:
      os.chdir(here)


if __name__ == '__main__':
  absltest.main()
