"""resume_policy.check on a checkpoint written before a setting existed: the
key it lacks counts as the setting's default, which its run ran with."""

from absl.testing import absltest

from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import resume_policy
from jaxgrpo.configs import common
from jaxgrpo.configs import demo


def _as_dict(datasets: tuple[str, ...] = (), **changes):
  """The resolved runlocal demo config with `section__key=value` changes,
  and arithmetic datasets of those names if given."""
  c = demo.get_config('runlocal')
  if datasets:
    c.data.datasets = [common.arithmetic_dataset(n) for n in datasets]
  for key, value in changes.items():
    section, name = key.split('__')
    c[section][name] = value
  return config_lib.to_dict(config_lib.from_config_dict(c))


def _older(config, *keys: str):
  """`config` as a checkpoint written before the settings `keys` existed
  (`rl.cut_completions`, `data.datasets[0].on_bad_record`)."""
  for key in keys:
    *path, last = key.split('.')
    where = config
    for part in path:
      if part.endswith(']'):
        name, index = part[:-1].split('[')
        where = where[name][int(index)]
      else:
        where = where[part]
    del where[last]
  return config


def check(saved, now, step=4):
  return resume_policy.check(saved, now, where='x', step=step)


class SettingAddedSinceTest(absltest.TestCase):

  def test_a_refused_key_counts_as_its_default(self):
    # It was skipped: a checkpoint from before rl.cut_completions resumed
    # under 'mask' without a word, where two current ones are refused.
    older = _older(_as_dict(), 'rl.cut_completions')
    with self.assertRaises(errors.ResumeError) as e:
      check(older, _as_dict(rl__cut_completions='mask'))
    self.assertIn(
        "trained with other settings: rl.cut_completions: (not saved: "
        "'train', its default) -> 'mask' (a value not saved is the default "
        'of a setting added after the checkpoint was written: its run was '
        'trained with it); these cannot change on resume', str(e.exception))
    # What it ran with: nothing changed.
    self.assertEqual(check(older, _as_dict()), [])
    # A section's keys, and a subsection's (model.lora), alike.
    older = _older(_as_dict(), 'rollout.engine', 'rollout.slots',
                   'rollout.collect', 'rollout.in_flight', 'model.lora.rank')
    self.assertEqual(check(older, _as_dict()), [])
    with self.assertRaisesRegex(
        errors.ResumeError, r"rollout.collect: \(not saved: 'rounds', its "
        r"default\) -> 'streaming'"):
      check(older, _as_dict(rollout__engine='continuous',
                            rollout__collect='streaming'))
    lora = _as_dict()
    lora['model']['lora']['rank'] = 8
    with self.assertRaisesRegex(
        errors.ResumeError, r'is for another model \(model.lora.rank: \(not '
        r'saved: 0, its default\) -> 8\) \(a value not saved is the default'):
      check(older, lora)

  def test_a_free_or_notice_key_counts_as_its_default(self):
    older = _older(_as_dict(), 'rollout.train_lengths', 'optim.learning_rate')
    self.assertEqual(check(older, _as_dict(rollout__train_lengths=1)), [])
    self.assertEqual(check(older, _as_dict(optim__learning_rate=5e-4)), [
        'resumed with a changed setting, optim.learning_rate: (not saved: '
        '0.001, its default) -> 0.0005: the optimizer steps from here on use '
        'the new values (step 5 on)'])

  def test_a_key_of_a_mode_that_is_off_stays_free(self):
    # rollout.slots is read by the continuous engine only; a checkpoint
    # from before both ran the static engine, the default.
    older = _older(_as_dict(), 'rollout.engine', 'rollout.slots')
    self.assertEqual(check(older, _as_dict(rollout__slots=8)), [])
    older = _older(_as_dict(), 'rollout.max_staleness')
    self.assertEqual(check(older, _as_dict(rollout__max_staleness=3)), [])
    # Read once the mode is on: refused like any key of its section.
    keep = dict(rollout__engine='continuous', rollout__collect='streaming',
                rollout__in_flight='keep')
    older = _older(_as_dict(**keep), 'rollout.max_staleness')
    with self.assertRaisesRegex(
        errors.ResumeError,
        r'rollout.max_staleness: \(not saved: 1, its default\) -> 3'):
      check(older, _as_dict(rollout__max_staleness=3, **keep))
    # The mode's key lacking: its default mode (the static engine) is on
    # for the checkpoint, so turning it on is the change refused.
    older = _older(_as_dict(), 'rollout.engine')
    with self.assertRaisesRegex(
        errors.ResumeError,
        r"rollout.engine: \(not saved: 'static', its default\) -> "
        r"'continuous'"):
      check(older, _as_dict(rollout__engine='continuous', rollout__slots=8))

  def test_a_dataset_entry_key_counts_as_its_default(self):
    older = _older(_as_dict(), 'data.datasets[0].on_bad_record',
                   'data.datasets[0].verifier',
                   'data.datasets[0].snooze_factor')
    self.assertEqual(check(older, _as_dict()), [])
    now = _as_dict()
    now['data']['datasets'][0]['on_bad_record'] = 'skip'  # free
    self.assertEqual(check(older, now), [])
    now['data']['datasets'][0]['verifier'] = 'math'  # a notice
    self.assertEqual(check(older, now), [
        'resumed with a changed setting, data.datasets[0].verifier: (not '
        "saved: 'exact_match', its default) -> 'math': completions are "
        'scored by the new verifier from here on (step 5 on)'])
    now['data']['datasets'][0]['snooze_factor'] = 4  # refused under snooze
    with self.assertRaisesRegex(
        errors.ResumeError, r'data.datasets\[0\].snooze_factor: \(not saved: '
        r'None, its default\) -> 4'):
      check(older, now)

  def test_keys_only_one_side_has_otherwise_are_skipped(self):
    # A dataset the checkpoint lacks is no setting of it (check_resumable
    # decides on it); neither is a setting since removed, nor a required
    # key (a dataset entry's kind).
    saved = _as_dict(('a',))
    now = _as_dict(('a', 'b'))
    now['data']['datasets'][1]['weight'] = 2.0
    now['data']['datasets'][1]['snooze_factor'] = 4
    self.assertEqual(check(saved, now), [])
    saved = _as_dict()
    saved['rl']['removed_since'] = 'x'
    del saved['data']['datasets'][0]['kind']
    self.assertEqual(check(saved, _as_dict()), [])

  def test_a_start_point_lacking_a_key_takes_any_data_setting(self):
    older = _older(_as_dict(), 'rollout.collect', 'rl.cut_completions')
    self.assertEqual(check(older, _as_dict(
        rollout__engine='continuous', rollout__collect='streaming'), step=0),
                     [])
    with self.assertRaisesRegex(errors.ResumeError, 'rl.cut_completions'):
      check(older, _as_dict(rl__cut_completions='mask'), step=0)


if __name__ == '__main__':
  absltest.main()
